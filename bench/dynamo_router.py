"""ai-dynamo-runtime's KV router in front of kvfleet sim ranks, over OpenAI HTTP (peers bench).

Run with the dynamo venv's python (ai-dynamo-runtime 1.6.1 pins pydantic<=2.13.5, kvfleet pins
2.14.3, so it lives in `.venv-dynamo` and this file imports nothing from kvfleet):

    .venv-dynamo/bin/python bench/dynamo_router.py --port P --policy kv_router \
        --worker-urls http://127.0.0.1:A http://127.0.0.1:B --model-path DIR --block-size 64

For each `POST /v1/completions` (token-id prompt) the policy's picker (`dynamo_pickers.POLICIES`)
chooses a rank from dynamo's prefix index; the request is forwarded unchanged and the rank's
answer (SSE stream or JSON) is copied back as it arrives. `GET /health` answers here; other GETs
go to the first rank. Every listener is on loopback; stop it with SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import itertools
import json
import signal
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamo_pickers import POLICIES, Picker, PickerSettings

HOST = "127.0.0.1"
PICK_TIMEOUT_S = 30.0
RANK_TIMEOUT_S = 600.0


class DynamoFront:
    """The picker on its own asyncio loop (a thread), called from the HTTP handler threads."""

    def __init__(self, policy: str, settings: PickerSettings, worker_urls: list[str]):
        self.worker_urls = worker_urls
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.picker: Picker = self.call(POLICIES[policy](settings))
        self.request_ids = itertools.count()

    def call(self, coroutine, timeout: float = PICK_TIMEOUT_S):
        """Run `coroutine` on the picker's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.call(self.picker.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _connection(url: str) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=RANK_TIMEOUT_S)


class Handler(BaseHTTPRequestHandler):
    """One request: pick a rank (POST /v1/completions), forward, copy the answer back."""

    front: DynamoFront  # set on the class by `serve`

    def log_message(self, format: str, *args) -> None:
        return None  # one line per request would flood the bench log

    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(200, b'{"status": "ok"}')
            return
        self._forward(self.front.worker_urls[0], None, None)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/completions":
            self._forward(self.front.worker_urls[0], body, None)
            return
        try:
            tokens = _prompt_tokens(json.loads(body))
        except ValueError as error:
            self._reply(400, json.dumps({"error": {"message": str(error)}}).encode())
            return
        request_id = f"dynamo-{next(self.front.request_ids)}"
        try:
            rank = self.front.call(self.front.picker.pick(request_id, tokens))
        except Exception as error:  # dynamo raises a plain Exception when no worker is up
            self._reply(503, json.dumps({"error": {"message": str(error)}}).encode())
            return
        try:
            self._forward(self.front.worker_urls[rank], body, request_id)
        finally:
            self.front.call(self.front.picker.done(request_id))

    def _forward(self, url: str, body: bytes | None, request_id: str | None) -> None:
        """Send the request to the rank at `url`; stream its answer back line by line."""
        connection = _connection(url)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            connection.request(self.command, self.path, body=body, headers=headers)
            answer = connection.getresponse()
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.getheader("Content-Type", "application/json"))
            self.end_headers()  # HTTP/1.0: the body ends when this connection closes
            first = request_id is not None
            for line in iter(answer.readline, b""):
                self.wfile.write(line)
                self.wfile.flush()
                if first and line.startswith(b"data:"):
                    self.front.call(self.front.picker.first_token(request_id))
                    first = False
        finally:
            connection.close()

    def _reply(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def _prompt_tokens(request: dict) -> list[int]:
    """The prompt as token ids (this front takes no text: the ranks' ids are what dynamo hashes)."""
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
        raise ValueError(f"prompt must be a list of token ids, got {type(prompt).__name__}")
    return prompt


def serve(args: argparse.Namespace) -> None:
    """Start the picker and the HTTP listener; run until SIGTERM or SIGINT."""
    settings = PickerSettings(
        ranks=len(args.worker_urls),
        block_size=args.block_size,
        model_path=str(args.model_path),
        workdir=args.workdir,
    )
    front = DynamoFront(args.policy, settings, args.worker_urls)
    Handler.front = front
    server = ThreadingHTTPServer((HOST, args.port), Handler)
    server.daemon_threads = True
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"dynamo router ({args.policy}) listening on {HOST}:{server.server_port}", flush=True)
    stop.wait()
    server.shutdown()
    front.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--policy", choices=list(POLICIES), default="kv_router")
    parser.add_argument("--worker-urls", nargs="+", required=True)
    parser.add_argument("--model-path", type=Path, required=True, help="a local model dir")
    parser.add_argument("--block-size", type=int, default=64, help="the ranks' page size")
    parser.add_argument("--workdir", type=Path, default=Path("."), help="discovery files")
    args = parser.parse_args()
    for url in args.worker_urls:
        if urllib.parse.urlsplit(url).hostname != HOST:
            parser.error(f"worker {url} is not on {HOST}: every address stays on loopback")
    serve(args)


if __name__ == "__main__":
    main()
