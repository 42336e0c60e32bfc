"""Reader for Claude Code session files (one session per file, sub-agents nested).

Ids are local to a file, so every block lives in the file's namespace. With
`shared_system_prefix`, the first (tool_tokens + system_tokens) // block_size blocks of every
session map onto one common chain, which models the tools and system prompt that sessions share
in production (sub-agents get one common chain per sub-agent type).

Timing: a turn's `think_time_s` is the trace's `think_time` (the client gap after the previous
request ended); a sub-agent starts `t - (previous turn's t + api_time)` seconds after the parent's
previous turn, and the parent's next turn waits for all sub-agents spawned since its last turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .model import Conversation, SubAgentSpawn, Turn

SOURCE = "claude_code"
SHARED_NAMESPACE = "claude_code/shared"


class TraceFormatError(ValueError):
    """A trace file does not have the fields its format requires."""


def read_claude_code(path: Path, *, shared_system_prefix: bool = False) -> Conversation:
    """Read one session file into a conversation with its sub-agents."""
    with open(path) as stream:
        session = json.load(stream)
    block_size = int(session.get("block_size", 64))
    namespace = f"{SOURCE}/{path.stem}"
    builder = _SessionBuilder(namespace, block_size, shared_system_prefix, path)
    return builder.conversation(namespace, session, SHARED_NAMESPACE, offset_s=0.0)


class _SessionBuilder:
    """Builds the conversations of one file; all of them share the file's namespace."""

    def __init__(self, namespace: str, block_size: int, shared: bool, path: Path) -> None:
        self.namespace = namespace
        self.block_size = block_size
        self.shared = shared
        self.path = path

    def conversation(
        self, conversation_id: str, node: dict[str, Any], shared_namespace: str, offset_s: float
    ) -> Conversation:
        """Turn one session or sub-agent node into a conversation; `offset_s` is its start in
        session time."""
        requests = node.get("requests")
        if not isinstance(requests, list):
            raise TraceFormatError(f"{self.path}: {conversation_id} has no 'requests' list")
        tool_tokens = int(node.get("tool_tokens", 0))
        tool_and_system = tool_tokens + int(node.get("system_tokens", 0))
        prefix_blocks = tool_and_system // self.block_size
        # One hint, where the tools and the system prompt end: what the engine's chat path
        # derives from the template (docs/engine.md, "Branch hints"); the tools' own end is
        # not a position the product knows.
        segment_ends = (tool_and_system,) if tool_and_system else ()
        reference: tuple[int, ...] | None = None
        steps: list[Turn | SubAgentSpawn] = []
        children: list[tuple[float, Conversation]] = []
        previous_end_s = 0.0
        turn_count = 0
        for request in requests:
            if request.get("type") == "subagent":
                child_id = f"{conversation_id}/{request.get('agent_id', len(children))}"
                child_shared = f"{SHARED_NAMESPACE}/subagent/{request.get('subagent_type', '')}"
                start_s = float(request["t"])
                child = self.conversation(child_id, request, child_shared, offset_s + start_s)
                children.append((max(0.0, start_s - previous_end_s), child))
                continue
            if children:
                steps.append(SubAgentSpawn(children=tuple(children)))
                children = []
            hash_ids = tuple(request["hash_ids"])
            if reference is None:
                reference = hash_ids[:prefix_blocks]
            shared_blocks = _common_length(hash_ids, reference) if self.shared else 0
            think = request.get("think_time")
            steps.append(
                Turn(
                    index=turn_count,
                    arrival_s=offset_s + float(request["t"]),
                    think_time_s=float(think) if think is not None else 0.0,
                    input_tokens=int(request["in"]),
                    output_tokens=int(request["out"]),
                    hash_ids=hash_ids,
                    namespace=self.namespace,
                    block_size=self.block_size,
                    shared_prefix_blocks=shared_blocks,
                    shared_namespace=shared_namespace if shared_blocks else "",
                    branch_hints=tuple(h for h in segment_ends if h <= int(request["in"])),
                    tool_tokens=tool_tokens,
                    system_tokens=tool_and_system - tool_tokens,
                )
            )
            turn_count += 1
            previous_end_s = float(request["t"]) + float(request.get("api_time") or 0.0)
        if children:
            steps.append(SubAgentSpawn(children=tuple(children)))
        return Conversation(conversation_id=conversation_id, source=SOURCE, steps=tuple(steps))


def _common_length(ids: tuple[int, ...], reference: tuple[int, ...]) -> int:
    """Length of the common leading run of two id sequences."""
    length = 0
    for own, common in zip(ids, reference, strict=False):
        if own != common:
            break
        length += 1
    return length
