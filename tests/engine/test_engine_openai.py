"""The OpenAI-compatible HTTP API answers the `openai` client, streaming and not."""

from __future__ import annotations

import httpx
import openai
import pytest
from engine_testkit import TEST_CONFIG, pages_in_use, wait_until
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses

CONFIG = TEST_CONFIG.with_changes(reuse_policy="per_request")


@pytest.fixture(scope="module")
def rank():
    rank = EngineRank(CONFIG, RankAddresses(http_port=0, rank_id="http-rank")).start()
    yield rank
    rank.core.check_integrity()
    rank.stop(grace=0.5)


@pytest.fixture(scope="module")
def client(rank):
    with openai.OpenAI(base_url=f"http://127.0.0.1:{rank.http_port}/v1", api_key="x") as client:
        yield client


def test_completion_reports_cached_tokens_on_the_second_turn(client):
    """Cached tokens missing from usage hide prefix reuse from every client."""
    prompt = "The quick brown fox jumps over the lazy dog, " * 3
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0)
    again = client.completions.create(
        model="tiny", prompt=prompt + first.choices[0].text, max_tokens=5, temperature=0,
        extra_headers={"X-Conversation-Id": "c1"},
    )  # fmt: skip
    assert first.usage.completion_tokens == 5 and first.choices[0].finish_reason == "length"
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 128
    # cache_write_tokens: the prompt's whole pages (16 tokens) past the reused ones.
    pages = [u.prompt_tokens // 16 * 16 for u in (first.usage, again.usage)]
    assert first.usage.prompt_tokens_details.cache_write_tokens == pages[0]
    assert again.usage.prompt_tokens_details.cache_write_tokens == pages[1] - 128


def test_streamed_completion_matches_the_plain_one_and_ends_with_usage(client):
    """A stream whose text or usage differs from the plain answer breaks streaming clients."""
    body = {"model": "kvfleet", "prompt": [10, 20, 30, 40], "max_tokens": 6, "temperature": 0}
    plain = client.completions.create(**body)
    chunks = list(
        client.completions.create(**body, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices


def test_chat_completion_streaming_and_not(client):
    """Chat answers that differ between stream and non-stream break chat clients."""
    messages = [{"role": "user", "content": "hello there"}]
    plain = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, seed=1
    )
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, seed=1, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert plain.choices[0].message.role == "assistant"
    assert streamed == plain.choices[0].message.content


def test_models_and_health(rank):
    """Clients list models and probes hit /health before sending work."""
    base = f"http://127.0.0.1:{rank.http_port}"
    models = httpx.get(f"{base}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny", "kvfleet"]
    assert httpx.get(f"{base}/health").json() == {"status": "ok"}


def test_a_ranks_own_api_names_no_placement(rank):
    """No router placed this request: a placement header here would be made up."""
    body = {"model": "tiny", "prompt": "x", "max_tokens": 1}
    reply = httpx.post(f"http://127.0.0.1:{rank.http_port}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200 and "x-kvfleet-rank" not in reply.headers


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "gpt-9", "prompt": "hi"}, "model"),
        ({"model": "tiny", "prompt": "hi", "temperature": -1}, "temperature"),
        ({"model": "tiny", "prompt": "hi", "top_p": 0}, "top_p"),
        ({"model": "tiny", "prompt": "x" * 5000}, "prompt"),
        ({"model": "tiny", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_input_is_400_naming_the_field(client, body, param):
    """A 500 or an unnamed field for bad input leaves the client guessing."""
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**body)
    assert error.value.status_code == 400 and error.value.body["param"] == param


def live_requests(core) -> int:
    """Requests the engine holds: running or queued (preempted ones wait in the queue)."""
    load = core.load()
    return load.running + load.queued


def test_client_that_disconnects_mid_stream_frees_its_pages(rank):
    """A dropped stream that keeps generating holds slots and pages until max_tokens."""
    # ignore_eos: a sampled stop token would end the request by itself, before the test sees it
    # live (the random tiny model stops within a few hundred tokens at temperature 1).
    body = {"model": "tiny", "prompt": "a" * 100, "max_tokens": 2000, "stream": True,
            "ignore_eos": True}  # fmt: skip
    ran_to_length = rank.core.metrics.finished.labels("length")
    lengths_before = ran_to_length._value.get()
    with (
        httpx.Client(base_url=f"http://127.0.0.1:{rank.http_port}") as http,
        http.stream("POST", "/v1/completions", json=body) as response,
    ):
        # Keep the line iterator: a dropped one is closed at once, and closing it closes the
        # connection, so the server would see the client leave before the test saw it live.
        lines = response.iter_lines()
        next(lines)
        # The load is published after each step, so the first token can arrive before it; and a
        # 2,100-token sequence in the test's small pools may be preempted (queued) for a while.
        wait_until(lambda: live_requests(rank.core) == 1, timeout=60)
    try:
        wait_until(lambda: live_requests(rank.core) == 0, timeout=60)
    except TimeoutError:
        raise AssertionError(f"the engine still holds the request: {rank.core.load()}") from None
    # Gone because the client left, not because it ran to max_tokens (a slow machine may take
    # long to notice, never that long to generate 2,000 tokens for nobody).
    assert ran_to_length._value.get() == lengths_before
    assert pages_in_use(rank.core) == {"full": 0, "window": 0}
