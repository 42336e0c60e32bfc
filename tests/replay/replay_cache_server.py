"""A tiny real OpenAI `/v1/completions` server for replay tests (not part of the product).

It keeps an infinite prefix cache of 16-token blocks, one for all requests, so a replay against
it sees perfect routing and an infinite cache: its prefix reuse is the oracle's. It streams one
chunk per output token, then a usage chunk with `prompt_tokens_details.cached_tokens`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

CACHE_BLOCK = 16


@dataclass
class BlockPrefixCache:
    """Chained hashes of every full block seen; `match_then_insert` is the only writer."""

    block_size: int = CACHE_BLOCK
    blocks: set[int] = field(default_factory=set)

    def match_then_insert(self, tokens: list[int]) -> int:
        """Tokens of the longest cached full-block prefix; then cache every full block."""
        parent = 0
        matched = 0
        missing = False
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            parent = hash((parent, tuple(tokens[start : start + self.block_size])))
            if not missing and parent in self.blocks:
                matched = start + self.block_size
            else:
                missing = True
                self.blocks.add(parent)
        return matched


@dataclass
class ServerLog:
    """What the server received, for assertions."""

    bodies: list[dict] = field(default_factory=list)
    conversation_headers: list[str | None] = field(default_factory=list)


@dataclass
class LastTokenGate:
    """Holds each stream's last token: `held` is set once the others are sent, and the last
    one goes out when the test sets `release` (so a test can tell chunk times apart by
    events instead of by sleeps)."""

    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


def build_app(
    cache: BlockPrefixCache,
    log: ServerLog,
    token_delay_s: float,
    fail_status: int | None,
    gate: LastTokenGate | None = None,
) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        log.bodies.append(body)
        log.conversation_headers.append(request.headers.get("x-conversation-id"))
        if fail_status is not None:
            return JSONResponse({"error": "refused by test"}, status_code=fail_status)
        prompt = body["prompt"]
        cached = cache.match_then_insert(prompt)
        max_tokens = body["max_tokens"]
        with_usage = bool(body.get("stream_options", {}).get("include_usage"))

        async def stream():
            for index in range(max_tokens):
                if token_delay_s:
                    await asyncio.sleep(token_delay_s)
                if gate is not None and index == max_tokens - 1:
                    gate.held.set()
                    await asyncio.to_thread(gate.release.wait, 30)
                chunk = {"choices": [{"index": 0, "text": f" t{index}"}], "usage": None}
                yield f"data: {json.dumps(chunk)}\n\n"
            if with_usage:
                usage = {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": max_tokens,
                    "prompt_tokens_details": {"cached_tokens": cached},
                }
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


@contextmanager
def running_server(
    token_delay_s: float = 0.0,
    fail_status: int | None = None,
    start_timeout_s: float = 10.0,
    gate: LastTokenGate | None = None,
) -> Iterator[tuple[str, BlockPrefixCache, ServerLog]]:
    """Serve on a free loopback port in a thread; yields (base URL, cache, log)."""
    cache, log = BlockPrefixCache(), ServerLog()
    app = build_app(cache, log, token_delay_s, fail_status, gate)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(int(start_timeout_s / 0.01)):
            if server.started:
                break
            threading.Event().wait(0.01)
        else:
            raise TimeoutError(f"test server did not start in {start_timeout_s} s")
        yield f"http://127.0.0.1:{port}", cache, log
    finally:
        server.should_exit = True
        thread.join(timeout=start_timeout_s)
        sock.close()
