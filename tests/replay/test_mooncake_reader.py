"""Mooncake reader: conversations rebuilt by the inferred-continuation rule."""

from __future__ import annotations

import json
from pathlib import Path

from kvfleet.services.replay.model import Turn
from kvfleet.services.replay.mooncake import infer_parents, read_mooncake, read_mooncake_requests
from replay_paths import MOONCAKE_CONVERSATION, MOONCAKE_SYNTHETIC


def _write(tmp_path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    path = tmp_path / "tiny.jsonl"
    lines = [
        json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h})
        for t, i, o, h in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_continuation_needs_parent_prefix_and_new_ids(tmp_path: Path) -> None:
    """If this fails, shared system prompts link unrelated requests or real turns are split."""
    path = _write(
        tmp_path,
        [
            (0, 1100, 10, [0, 1, 2]),  # 0: root; introduces 0 and 1
            (0, 600, 10, [0, 5]),  # 1: root: does not start with [0, 1]
            (1000, 1800, 10, [0, 1, 3, 4]),  # 2: continues 0
            (1000, 600, 10, [0, 7]),  # 3: root; its [:-1] = [0] is nothing new
            (2000, 1100, 10, [0, 8, 9]),  # 4: root: starts with 3's [:-1], but 3 added nothing
            (3000, 2400, 10, [0, 1, 3, 10, 11]),  # 5: continues 2
        ],
    )
    assert infer_parents(read_mooncake_requests(path)) == [None, None, 0, None, None, 2]


def test_tiny_trace_conversations_and_think_times(tmp_path: Path) -> None:
    """If this fails, turns are misordered or think times are not arrival gaps."""
    path = _write(
        tmp_path,
        [(0, 700, 5, [10, 11]), (500, 600, 5, [20, 21]), (4000, 1200, 7, [10, 12, 13])],
    )
    conversations = read_mooncake(path)
    assert [c.conversation_id for c in conversations] == ["mooncake/tiny/0", "mooncake/tiny/1"]
    turns = list(conversations[0].turns())
    assert [(t.index, t.arrival_s, t.think_time_s) for t in turns] == [(0, 0.0, 0.0), (1, 4.0, 4.0)]
    assert turns[1] == Turn(
        index=1,
        arrival_s=4.0,
        think_time_s=4.0,
        input_tokens=1200,
        output_tokens=7,
        hash_ids=(10, 12, 13),
        namespace="mooncake/tiny",
        block_size=512,
    )


def test_conversation_trace_rebuilds_readme_counts() -> None:
    """If this fails, the conversation trace no longer gives 8,068 conversations (longest 43)."""
    conversations = read_mooncake(MOONCAKE_CONVERSATION)
    sizes = [c.request_count() for c in conversations]
    assert (len(conversations), sum(sizes), max(sizes)) == (8068, 12031, 43)


def test_synthetic_trace_rebuilds_readme_counts() -> None:
    """If this fails, the synthetic trace no longer gives 2,652 conversations (longest 24)."""
    conversations = read_mooncake(MOONCAKE_SYNTHETIC)
    sizes = [c.request_count() for c in conversations]
    assert (len(conversations), sum(sizes), max(sizes)) == (2652, 3993, 24)
