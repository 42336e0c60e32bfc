"""The http:// target against a real OpenAI-style completions server on loopback."""

from __future__ import annotations

import asyncio

import pytest
from kvfleet.services.replay.http_target import CONVERSATION_HEADER, OpenAICompletionsTarget
from kvfleet.services.replay.target_types import TargetError
from replay_cache_server import LastTokenGate, running_server


async def test_reads_cached_tokens_from_usage() -> None:
    """If this fails, reuse reported by a live engine is lost."""
    with running_server() as (url, _cache, _log):
        target = OpenAICompletionsTarget(url, timeout_s=10)
        try:
            first = await target.generate("conv-1", list(range(40)), 3)
            second = await target.generate("conv-1", [*range(40), 7, 7], 2)
        finally:
            await target.aclose()
    assert (first.prompt_tokens, first.cached_tokens, first.output_tokens) == (40, 0, 3)
    assert (second.prompt_tokens, second.cached_tokens, second.output_tokens) == (42, 32, 2)


class CountingClock:
    """The target's wall clock, counting its readings so the test knows when a chunk was timed."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.readings = 0

    def now(self) -> float:
        self.readings += 1
        return self.clock.now()


async def test_times_every_chunk_from_first_token() -> None:
    """If this fails, TTFT or inter-token latency are taken from the wrong moments: the server
    holds the last token until the client has timed three chunks and the test has taken a
    mark, so the first three times must fall before the mark and the last after it."""
    gate = LastTokenGate()
    with running_server(gate=gate) as (url, _cache, _log):
        target = OpenAICompletionsTarget(url, timeout_s=10)
        clock = target.clock = CountingClock(target.clock)
        try:
            generation = asyncio.create_task(target.generate("c", [1, 2, 3], 4))
            assert await asyncio.to_thread(gate.held.wait, 30)
            deadline = clock.clock.now() + 30
            while clock.readings < 3 and clock.clock.now() < deadline:
                await asyncio.sleep(0.01)
            mark = clock.clock.now()
            gate.release.set()
            generation = await generation
        finally:
            gate.release.set()
            await target.aclose()
    times = generation.token_times_s
    assert len(times) == 4
    assert generation.first_token_s == times[0]
    assert max(times[:3]) < mark < times[3]
    assert generation.finish_s >= times[-1]


async def test_sends_token_ids_and_conversation_id() -> None:
    """If this fails, a router cannot pin the conversation or the prompt is not token ids."""
    with running_server() as (url, _cache, log):
        target = OpenAICompletionsTarget(url, model="m", timeout_s=10)
        try:
            await target.generate("conv-9", [5, 6], 1)
        finally:
            await target.aclose()
    (body,) = log.bodies
    assert (body["prompt"], body["model"], body["user"], body["max_tokens"]) == (
        [5, 6],
        "m",
        "conv-9",
        1,
    )
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert log.conversation_headers == ["conv-9"]
    assert CONVERSATION_HEADER == "X-Conversation-Id"


async def test_http_error_raises_target_error() -> None:
    """If this fails, a refused request is recorded as a success."""
    with running_server(fail_status=503) as (url, _cache, _log):
        target = OpenAICompletionsTarget(url, timeout_s=10)
        try:
            with pytest.raises(TargetError, match="HTTP 503"):
                await target.generate("c", [1], 1)
        finally:
            await target.aclose()


async def test_unreachable_server_raises_target_error() -> None:
    """If this fails, a dead engine crashes the whole replay instead of failing one request."""
    with running_server() as (url, _cache, _log):
        pass  # the port is free again once the server stopped
    target = OpenAICompletionsTarget(url, timeout_s=2)
    try:
        with pytest.raises(TargetError, match="completions request failed"):
            await target.generate("c", [1], 1)
    finally:
        await target.aclose()
