"""`kvfleet router --http-port`: the OpenAI API and GET /health served by the router process.

A real router process and a real engine rank on loopback; the `openai` client holds a
two-turn chat through the router's HTTP port, with the conversation in `X-Conversation-Id`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import ssl
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from engine_testkit import TEST_CONFIG, wait_until
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.router.fleet_secret import SECRET_ENV

FLEET_SECRET = "front-test-secret"


def start_router(*extra: str) -> tuple[subprocess.Popen, int, int]:
    """A `kvfleet router` process on free ports; returns it, its rank and its HTTP port."""
    process = subprocess.Popen(
        [sys.executable, "-m", "kvfleet.services.cli", "router", "--host", "127.0.0.1",
         "--grpc-port", "0", "--rank-port", "0", "--http-port", "0", "--metrics-port", "-1",
         "--grace-seconds", "30", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, SECRET_ENV: FLEET_SECRET},
    )  # fmt: skip
    lines = [process.stdout.readline(), process.stdout.readline()]
    rank_port = re.search(r"rank port (\d+)", lines[0])
    http_port = re.search(r"http port (\d+)", lines[1])
    if rank_port is None or http_port is None:
        process.kill()
        raise RuntimeError(f"router did not print its ports: {lines!r}")
    return process, int(rank_port.group(1)), int(http_port.group(1))


@contextlib.contextmanager
def router_with_a_rank(*extra: str, scheme: str = "http"):
    """A router process and one engine rank registered with it; (process, base URL, rank)."""
    process, rank_port, http_port = start_router(*extra)
    addresses = RankAddresses(
        router=f"127.0.0.1:{rank_port}", rank_id="front-rank", fleet_secret=FLEET_SECRET
    )
    rank = EngineRank(TEST_CONFIG, addresses).start()
    try:
        assert rank.link.registered.wait(30), "the rank did not register with the router"
        yield process, f"{scheme}://localhost:{http_port}", rank
    finally:
        rank.stop(grace=0.5)
        if process.poll() is None:
            process.kill()
        process.wait(30)


@pytest.fixture(scope="module")
def fleet():
    with router_with_a_rank() as running:
        yield running


def test_two_turn_chat_through_the_router_reuses_the_first_turn(fleet):
    """Without an OpenAI entry point on the router, clients of a deployed fleet hit a rank
    directly and lose the pins; through it the second turn reuses the first's KV."""
    _process, base, _rank = fleet
    headers = {"X-Conversation-Id": "front-chat-1"}
    messages = [{"role": "user", "content": "Plan the refactor of the parser module. " * 4}]
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["tiny", "kvfleet"]
        first = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=6, temperature=0, extra_headers=headers
        )
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Now write the tests."},
        ]
        stream = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_headers=headers,
        )  # fmt: skip
        chunks = list(stream)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    # What the rank wrote crosses the router's gRPC (Usage.cache_write_tokens).
    written = first.usage.prompt_tokens_details.cache_write_tokens
    assert written == first.usage.prompt_tokens // 16 * 16 > 0
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_each_answer_names_the_rank_that_served_it_and_why(fleet):
    """Without the headers a client cannot tell whether a turn went home: the first turn is
    placed `new`, the next `pinned`, on the same rank, streamed or whole, on both APIs."""
    _process, base, _rank = fleet
    headers = {"X-Conversation-Id": "front-served-1"}
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as client:
        whole = client.completions.with_raw_response.create(
            model="tiny", prompt="where did this run", max_tokens=2, extra_headers=headers
        )
        with client.chat.completions.with_streaming_response.create(
            model="tiny", messages=[{"role": "user", "content": "and this?"}], max_tokens=2,
            stream=True, extra_headers=headers,
        ) as streamed:  # fmt: skip
            list(streamed.iter_lines())
    served = [(r.headers["x-kvfleet-rank"], r.headers["x-kvfleet-placement"])
              for r in (whole, streamed)]  # fmt: skip
    assert served == [("front-rank", "new"), ("front-rank", "pinned")]
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    messages = httpx.post(f"{base}/v1/messages", json=body, headers=headers, timeout=60)
    assert (messages.status_code, messages.headers["x-kvfleet-placement"]) == (200, "pinned")


def health(base: str) -> int | None:
    try:
        return httpx.get(f"{base}/health", timeout=10).status_code
    except httpx.HTTPError:
        return None


def test_health_is_200_while_serving_and_503_once_the_router_stops(fleet):
    """Kubernetes httpGet probes need an HTTP answer that follows the router's own health;
    a stream in flight keeps its grace while the probe already says 503."""
    process, base, rank = fleet
    assert health(base) == 200
    body = {"model": "tiny", "prompt": "a" * 40, "max_tokens": 2000, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with (
        httpx.Client(base_url=base, timeout=60) as http,
        http.stream("POST", "/v1/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        release = threading.Event()  # the rank makes no progress until released: the stream
        held = threading.Thread(target=rank.core.call_on_core, args=(lambda: release.wait(60), 60))
        held.start()  # stays open whatever the machine's speed
        process.send_signal(signal.SIGTERM)  # graceful stop: gRPC health turns NOT_SERVING
        try:
            wait_until(lambda: health(base) == 503)
        finally:
            release.set()
            held.join()
        assert any(line.startswith("data: ") for line in lines)  # streamed on within the grace


def test_with_a_certificate_both_client_doors_serve_tls_only(certificate):
    """The router's certificate covers its HTTP port too: an OpenAI client that trusts it
    holds a chat there, plain HTTP gets no answer, and the front reaches its own router
    although the client port now speaks TLS only."""
    cert, key = certificate
    tls = ("--tls-cert-file", str(cert), "--tls-key-file", str(key))
    with router_with_a_rank(*tls, scheme="https") as (_process, base, _rank):
        with (
            httpx.Client(verify=ssl.create_default_context(cafile=cert), timeout=60) as trusting,
            openai.OpenAI(
                base_url=f"{base}/v1", api_key="x", max_retries=0, http_client=trusting
            ) as client,
        ):
            reply = client.completions.create(
                model="tiny", prompt="a" * 20, max_tokens=3, extra_body={"ignore_eos": True}
            )
            assert reply.usage.completion_tokens == 3
        plain = base.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{plain}/health", timeout=10)
