"""Claude Code reader: sessions, sub-agents, namespaces, the shared system chain, the filter."""

from __future__ import annotations

import json

from kvfleet.services.replay.claude_code import SHARED_NAMESPACE, read_claude_code
from kvfleet.services.replay.model import SubAgentSpawn
from kvfleet.services.replay.readers import filter_max_model_len, read_traces, trace_order
from replay_paths import CLAUDE_CODE

SUBAGENT_SESSION = CLAUDE_CODE / "trace_0010.json"
PLAIN_SESSION = CLAUDE_CODE / "trace_0002.json"


def _model_requests(node: dict) -> int:
    return sum(_model_requests(r) if r["type"] == "subagent" else 1 for r in node["requests"])


def test_request_count_includes_subagents() -> None:
    """If this fails, sub-agent requests are lost or counted twice."""
    raw = json.loads(SUBAGENT_SESSION.read_text())
    conversation = read_claude_code(SUBAGENT_SESSION)
    assert conversation.request_count() == _model_requests(raw) == 172


def test_consecutive_subagents_spawn_together() -> None:
    """If this fails, sub-agents started back to back no longer run concurrently."""
    conversation = read_claude_code(SUBAGENT_SESSION)
    spawns = [s for s in conversation.steps if isinstance(s, SubAgentSpawn)]
    assert [[c.conversation_id for c in s.conversations()] for s in spawns] == [
        ["claude_code/trace_0010/agent_001"],
        [
            "claude_code/trace_0010/agent_002",
            "claude_code/trace_0010/agent_003",
            "claude_code/trace_0010/agent_004",
        ],
    ]
    # agent_001 starts at t=100.65, after turn 0 (t=0, api_time 8.81) ended.
    assert spawns[0].children[0][0] == 100.65 - 8.81


def test_subagent_turns_use_parent_namespace_and_session_time() -> None:
    """If this fails, sub-agent ids leave the file's namespace or arrive at the wrong time."""
    conversation = read_claude_code(SUBAGENT_SESSION)
    child = next(conversation.subagents())
    first = next(child.turns())
    assert first.namespace == "claude_code/trace_0010"
    assert first.arrival_s == 100.65
    assert {t.namespace for c in conversation.all_conversations() for t in c.turns()} == {
        "claude_code/trace_0010"
    }


def test_turns_keep_trace_fields() -> None:
    """If this fails, token counts, think times or block ids are read wrongly."""
    turn = list(read_claude_code(PLAIN_SESSION).turns())[1]
    assert (turn.index, turn.arrival_s, turn.think_time_s) == (1, 9.0, 3.0)
    assert (turn.input_tokens, turn.output_tokens, turn.block_size) == (16003, 99, 64)
    assert len(turn.hash_ids) == 16003 // 64
    assert turn.shared_prefix_blocks == 0


def test_shared_system_prefix_maps_onto_one_chain() -> None:
    """If this fails, sessions share no tools+system prefix, or share more than it."""
    first = next(read_claude_code(PLAIN_SESSION, shared_system_prefix=True).turns())
    other = next(read_claude_code(SUBAGENT_SESSION, shared_system_prefix=True).turns())
    assert first.shared_prefix_blocks == (12448 + 2882) // 64
    keys, other_keys = list(first.block_keys()), list(other.block_keys())
    common = min(first.shared_prefix_blocks, other.shared_prefix_blocks)
    assert keys[:common] == other_keys[:common] == [(SHARED_NAMESPACE, i) for i in range(common)]
    assert keys[first.shared_prefix_blocks] == ("claude_code/trace_0002", first.hash_ids[239])


def test_filter_drops_long_turns_and_renumbers() -> None:
    """If this fails, --max-model-len lets long turns through or leaves gaps in turn indexes."""
    conversation = read_claude_code(SUBAGENT_SESSION)
    (kept,) = filter_max_model_len([conversation], 30_000)
    for c in kept.all_conversations():
        turns = list(c.turns())
        assert [t.index for t in turns] == list(range(len(turns)))
        assert all(t.input_tokens + t.output_tokens <= 30_000 for t in turns)
    assert [t.input_tokens for t in kept.turns()] == [17209, 22038, 28255]


def test_filter_drops_empty_conversations() -> None:
    """If this fails, conversations with no turn left are still replayed."""
    conversations = read_traces([PLAIN_SESSION, SUBAGENT_SESSION])
    assert filter_max_model_len(conversations, 10_000) == []


def test_trace_order_interleaves_subagents_by_arrival() -> None:
    """If this fails, the oracle sees sub-agent requests out of arrival order."""
    order = list(trace_order([read_claude_code(SUBAGENT_SESSION)]))
    arrivals = [turn.arrival_s for _, turn in order]
    assert arrivals == sorted(arrivals)
    assert [(cid, turn.arrival_s) for cid, turn in order[:3]] == [
        ("claude_code/trace_0010", 0.0),
        ("claude_code/trace_0010/agent_001", 100.65),
        ("claude_code/trace_0010", 107.0),
    ]


def test_turns_hint_where_the_tools_and_the_system_prompt_end() -> None:
    """One hint per turn, where the chat path derives it (the tools' and the system prompt's
    end, from the template): a replay that hinted more than the product derives measured
    resumes users do not get (trace_0002: 12448 + 2882 tokens)."""
    raw = json.loads(PLAIN_SESSION.read_text())
    assert (raw["tool_tokens"], raw["system_tokens"]) == (12448, 2882)
    for conversation in read_claude_code(SUBAGENT_SESSION).all_conversations():
        for turn in conversation.turns():
            assert all(0 < hint <= turn.input_tokens for hint in turn.branch_hints)
    assert list(read_claude_code(PLAIN_SESSION).turns())[1].branch_hints == (12448 + 2882,)
