"""The oracle: infinite cache, perfect routing, exactly as the traces README defines it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.services.replay.model import Turn
from kvfleet.services.replay.oracle import OracleSummary, PrefixOracle, summarise
from kvfleet.services.replay.readers import read_traces, trace_files, trace_order
from replay_paths import CLAUDE_CODE, MOONCAKE_CONVERSATION, MOONCAKE_SYNTHETIC


def _turn(ids: list[int], namespace: str = "n", block_size: int = 4, shared: int = 0) -> Turn:
    return Turn(
        index=0,
        arrival_s=0.0,
        think_time_s=0.0,
        input_tokens=max(1, len(ids) * block_size),
        output_tokens=1,
        hash_ids=tuple(ids),
        namespace=namespace,
        block_size=block_size,
        shared_prefix_blocks=shared,
        shared_namespace="common" if shared else "",
    )


def _figures(paths) -> OracleSummary:
    return summarise(turn for _, turn in trace_order(read_traces(paths)))


def test_reuse_is_longest_seen_prefix_chain() -> None:
    """If this fails, requests reuse blocks that were never seen as their prefix."""
    oracle = PrefixOracle()
    reused = [
        oracle.offer(_turn(ids)).reused_blocks
        for ids in ([1, 2, 3], [1, 2, 4], [1, 2, 3, 5], [3, 2])
    ]
    assert reused == [0, 2, 3, 0]
    assert oracle.unique_blocks == 7


def test_namespaces_never_meet() -> None:
    """If this fails, ids local to one session file match another file's ids."""
    oracle = PrefixOracle()
    oracle.offer(_turn([1, 2, 3], namespace="a"))
    assert oracle.offer(_turn([1, 2, 3], namespace="b")).reused_blocks == 0


def test_shared_chain_is_reused_across_namespaces() -> None:
    """If this fails, the common tools+system chain is not shared between sessions."""
    oracle = PrefixOracle()
    oracle.offer(_turn([1, 2, 3], namespace="a", shared=2))
    assert oracle.offer(_turn([7, 8, 9], namespace="b", shared=2)).reused_blocks == 2


def test_reused_tokens_are_capped_at_prompt() -> None:
    """If this fails, a partial last block counts more tokens than the prompt has."""
    oracle = PrefixOracle()
    turn = Turn(0, 0.0, 0.0, 600, 1, (1, 2), "n", 512)
    oracle.offer(turn)
    match = oracle.offer(turn)
    assert (match.reused_blocks, match.reused_tokens, match.prompt_tokens) == (2, 600, 600)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=6), max_size=12))
def test_matches_brute_force_prefix_search(requests: list[list[int]]) -> None:
    """If this fails, the trie disagrees with comparing against every earlier prompt."""
    oracle = PrefixOracle()
    for position, ids in enumerate(requests):
        expected = 0
        for earlier in requests[:position]:
            common = 0
            while common < min(len(ids), len(earlier)) and ids[common] == earlier[common]:
                common += 1
            expected = max(expected, common)
        assert oracle.offer(_turn(ids)).reused_blocks == expected


def test_mooncake_conversation_figures() -> None:
    """If this fails, the oracle no longer gives the README's 36.6 % and 6.1 % req <2 %."""
    summary = _figures([MOONCAKE_CONVERSATION])
    assert summary.requests == 12031
    assert round(summary.block_reuse, 3) == 0.366
    assert round(summary.share_under_2_percent, 3) == 0.061


def test_mooncake_synthetic_figures() -> None:
    """If this fails, the oracle no longer gives the README's 64.0 % and 55.4 % req <2 %."""
    summary = _figures([MOONCAKE_SYNTHETIC])
    assert summary.requests == 3993
    assert round(summary.block_reuse, 3) == 0.640
    assert round(summary.share_under_2_percent, 3) == 0.554


def _independent_block_reuse(raw_requests: list[list[int]]) -> float:
    """The README's rule in its plainest form: a set of every prefix seen, as tuples."""
    seen: set[tuple[int, ...]] = set()
    reused = total = 0
    for ids in raw_requests:
        length = 0
        while length < len(ids) and tuple(ids[: length + 1]) in seen:
            length += 1
        reused += length
        total += len(ids)
        seen.update(tuple(ids[: end + 1]) for end in range(len(ids)))
    return reused / total


def test_claude_code_subset_matches_independent_count() -> None:
    """If this fails, reading plus the oracle disagree with the rule applied to the raw file."""
    path = CLAUDE_CODE / "trace_0291.json"
    raw = json.loads(path.read_text())
    flat = []
    for request in raw["requests"]:
        children = request["requests"] if request["type"] == "subagent" else [request]
        offset = request["t"] if request["type"] == "subagent" else 0.0
        flat += [(offset + r["t"], r["hash_ids"][:300]) for r in children]
    flat.sort(key=lambda item: item[0])
    expected = _independent_block_reuse([ids for _, ids in flat])
    truncated = [
        replace(turn, hash_ids=turn.hash_ids[:300], input_tokens=64 * min(300, len(turn.hash_ids)))
        for _, turn in trace_order(read_traces([path]))
    ]
    assert summarise(truncated).block_reuse == expected


@pytest.mark.slow
def test_claude_code_figures() -> None:
    """If this fails, the oracle no longer gives the README's 96.4 % and 1.5 % req <2 %."""
    # Ids are local to each file, so files are summed one by one (a small trie is faster).
    summary = OracleSummary(0, 0, 0, 0, 0, 0)
    for path in trace_files(CLAUDE_CODE):
        summary = summary + _figures([path])
    assert summary.requests == 15249
    assert round(summary.block_reuse, 3) == 0.964
    assert round(summary.share_under_2_percent, 3) == 0.015
