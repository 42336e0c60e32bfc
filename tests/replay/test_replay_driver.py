"""The load driver: sessions, pacing, sub-agents, and reuse against a real completions server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from itertools import pairwise
from pathlib import Path

import pytest
from kvfleet.services.replay.claude_code import read_claude_code
from kvfleet.services.replay.driver import DriverOptions, LoadDriver
from kvfleet.services.replay.mooncake import read_mooncake
from kvfleet.services.replay.readers import filter_max_model_len
from kvfleet.services.replay.records import RequestRecord
from kvfleet.services.replay.runner import run_arm
from kvfleet.services.replay.target import open_target
from kvfleet.services.replay.tokens import TokenSynthesizer
from replay_cache_server import LastTokenGate, running_server
from replay_paths import CLAUDE_CODE

RUN_TIMEOUT_S = 60


def _mooncake(tmp_path: Path, rows: list[tuple[int, int, int, list[int]]]):
    path = tmp_path / "tiny.jsonl"
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h})
            + "\n"
            for t, i, o, h in rows
        )
    )
    return read_mooncake(path)


async def _drive(url: str, conversations, options: DriverOptions) -> list[RequestRecord]:
    target = open_target(url)
    try:
        driver = LoadDriver(target, TokenSynthesizer(0, 32000), options)
        return await asyncio.wait_for(driver.run(conversations), RUN_TIMEOUT_S)
    finally:
        await target.aclose()


def _subagent_slice():
    """Session 0282 up to 32k tokens: 2 turns, 3 sub-agents spawned together, 1 turn."""
    (session,) = filter_max_model_len([read_claude_code(CLAUDE_CODE / "trace_0282.json")], 32_768)
    return session


def _assert_sequential(records: list[RequestRecord]) -> None:
    """Invariant: a conversation's turns go one at a time, in order."""
    by_conversation: dict[str, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: r.arrival_s):
        by_conversation.setdefault(record.conversation_id, []).append(record)
    for turns in by_conversation.values():
        assert [r.turn_index for r in turns] == list(range(len(turns)))
        for earlier, later in pairwise(turns):
            assert later.arrival_s >= earlier.finish_s


async def test_claude_slice_reaches_oracle_on_infinite_cache() -> None:
    """If this fails, synthesised tokens lose (or invent) prefix structure, or sub-agent turns
    are not replayed."""
    session = _subagent_slice()
    with running_server() as (url, _cache, _log):
        target = open_target(url)
        try:
            result = await asyncio.wait_for(
                run_arm(
                    "a",
                    target,
                    [session],
                    TokenSynthesizer(1, 32000),
                    DriverOptions(2, 0.0, 0.0),
                    {},
                ),
                RUN_TIMEOUT_S,
            )
        finally:
            await target.aclose()
    measures = result.measures
    assert measures.requests == session.request_count() == 24
    assert result.errors == []
    assert measures.prefix_reuse == measures.oracle_reuse
    assert 0.5 < measures.oracle_reuse <= 1.0
    _assert_sequential(result.records)


async def test_parent_waits_for_subagents() -> None:
    """If this fails, a parent turn is sent while its sub-agents are still running."""
    session = _subagent_slice()
    with running_server() as (url, _cache, _log):
        records = await _drive(url, [session], DriverOptions(1, 0.0, 0.0))
    parent = [r for r in records if r.conversation_id == session.conversation_id]
    children = [r for r in records if r.conversation_id != session.conversation_id]
    assert {r.conversation_id for r in children} == {
        f"{session.conversation_id}/agent_001",
        f"{session.conversation_id}/agent_002",
        f"{session.conversation_id}/agent_003",
    }
    after_spawn = next(r for r in parent if r.turn_index == 2)
    assert after_spawn.arrival_s >= max(r.finish_s for r in children)
    # The sub-agents of one spawn run at the same time.
    ids = {r.conversation_id for r in children}
    starts = [min(r.arrival_s for r in children if r.conversation_id == c) for c in ids]
    ends = [max(r.finish_s for r in children if r.conversation_id == c) for c in ids]
    assert max(starts) < min(ends)
    _assert_sequential(records)


async def test_one_session_runs_conversations_one_after_another(tmp_path: Path) -> None:
    """If this fails, --sessions does not bound how many conversations run at once."""
    conversations = _mooncake(tmp_path, [(0, 600, 2, [1, 2]), (0, 600, 2, [3, 4])])
    with running_server() as (url, _cache, _log):
        records = await _drive(url, conversations, DriverOptions(1, 0.0, 0.0))
    first, second = sorted(records, key=lambda r: r.arrival_s)
    assert (first.conversation_id, second.conversation_id) == (
        "mooncake/tiny/0",
        "mooncake/tiny/1",
    )
    assert second.arrival_s >= first.finish_s


async def test_sessions_start_at_staggered_offsets(tmp_path: Path) -> None:
    """If this fails, all sessions start at once and the first turns arrive as one burst."""
    conversations = _mooncake(tmp_path, [(0, 600, 2, [1, 2]), (0, 600, 2, [3, 4])])
    # Each stream's last token waits until both first turns have arrived (or 30 s): sessions
    # that ran one after the other would show as a first turn that finishes before the second.
    gate = LastTokenGate()
    with running_server(gate=gate) as (url, _cache, log):
        waiter = threading.Thread(target=_release_when, args=(gate, lambda: len(log.bodies) >= 2))
        waiter.start()
        try:
            records = await _drive(url, conversations, DriverOptions(2, 0.0, 0.1))
        finally:
            gate.release.set()
            waiter.join()
    first, second = sorted(records, key=lambda r: r.arrival_s)
    # Slot 1 may not start before its offset from the run's start; slot 0 may start late on a
    # loaded machine, so the gap between the two is not the rule.
    assert second.arrival_s >= 0.1 - 0.005  # asyncio may wake a timer within its clock resolution
    assert second.arrival_s < first.finish_s  # both sessions run at once


def _release_when(gate: LastTokenGate, condition, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition() and time.monotonic() < deadline and not gate.release.is_set():
        time.sleep(0.01)
    gate.release.set()


async def test_think_time_is_scaled(tmp_path: Path) -> None:
    """If this fails, --time-scale does not pace turns by the trace's think time."""
    conversations = _mooncake(tmp_path, [(0, 600, 2, [1, 2]), (5000, 1100, 2, [1, 5, 6])])
    with running_server() as (url, _cache, _log):
        records = await _drive(url, conversations, DriverOptions(1, 0.02, 0.0))
    first, second = sorted(records, key=lambda r: r.arrival_s)
    assert second.arrival_s - first.finish_s >= 5.0 * 0.02 * 0.9
    _assert_sequential(records)


async def test_failed_requests_are_recorded_and_run_continues(tmp_path: Path) -> None:
    """If this fails, one refused request aborts the replay or counts as served."""
    conversations = _mooncake(tmp_path, [(0, 600, 2, [1, 2]), (1000, 1100, 2, [1, 5, 6])])
    with running_server(fail_status=500) as (url, _cache, _log):
        records = await _drive(url, conversations, DriverOptions(1, 0.0, 0.0))
    assert [(r.turn_index, r.ok) for r in records] == [(0, False), (1, False)]
    assert "HTTP 500" in (records[0].error or "")


async def test_same_seed_sends_same_prompts(tmp_path: Path) -> None:
    """If this fails, --seed does not make a run repeatable."""
    rows = [(0, 600, 2, [1, 2]), (1000, 1100, 2, [1, 5, 6])]
    bodies = []
    for _ in range(2):
        with running_server() as (url, _cache, log):
            await _drive(url, _mooncake(tmp_path, rows), DriverOptions(1, 0.0, 0.0))
        bodies.append([b["prompt"] for b in log.bodies])
    assert bodies[0] == bodies[1]
    assert [len(p) for p in bodies[0]] == [600, 1100]


def test_rejects_zero_sessions() -> None:
    """If this fails, --sessions 0 silently replays nothing."""
    with pytest.raises(ValueError, match="sessions=0"):
        DriverOptions(sessions=0)
