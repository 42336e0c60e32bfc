"""Pick a reader per trace path, and filter turns a model cannot take.

Readers are registered by file suffix; a directory stands for the session files in it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from .claude_code import TraceFormatError, read_claude_code
from .model import Conversation, SubAgentSpawn, Turn
from .mooncake import read_mooncake


@dataclass(frozen=True)
class ReadOptions:
    """How traces are read."""

    shared_system_prefix: bool = False


Reader = Callable[[Path, ReadOptions], list[Conversation]]

READERS: dict[str, Reader] = {
    ".jsonl": lambda path, _options: read_mooncake(path),
    ".json": lambda path, options: [
        read_claude_code(path, shared_system_prefix=options.shared_system_prefix)
    ],
}


def trace_files(path: Path) -> list[Path]:
    """The trace files a path names: the file itself, or a directory's trace files sorted."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in READERS and p.stem != "MANIFEST")
    if not path.exists():
        raise FileNotFoundError(f"trace {path} does not exist")
    return [path]


def read_traces(paths: Iterable[Path], options: ReadOptions | None = None) -> list[Conversation]:
    """Read every conversation of the given trace files or directories."""
    options = options or ReadOptions()
    conversations: list[Conversation] = []
    seen_ids: set[str] = set()
    for path in paths:
        for file in trace_files(Path(path)):
            reader = READERS.get(file.suffix)
            if reader is None:
                raise TraceFormatError(
                    f"{file}: no reader for suffix {file.suffix!r}; known: {sorted(READERS)}"
                )
            for conversation in reader(file, options):
                if conversation.conversation_id in seen_ids:
                    raise ValueError(f"{file}: conversation {conversation.conversation_id} twice")
                seen_ids.add(conversation.conversation_id)
                conversations.append(conversation)
    return conversations


def filter_max_model_len(
    conversations: Iterable[Conversation], max_model_len: int
) -> list[Conversation]:
    """Drop turns whose prompt plus output exceeds `max_model_len`, renumber the rest, and drop
    conversations (and sub-agents) left without turns."""
    if max_model_len < 1:
        raise ValueError(f"max_model_len={max_model_len} must be >= 1")
    kept = (_filtered(c, max_model_len) for c in conversations)
    return [c for c in kept if c is not None]


def _filtered(conversation: Conversation, max_model_len: int) -> Conversation | None:
    steps: list[Turn | SubAgentSpawn] = []
    turn_count = 0
    for step in conversation.steps:
        if isinstance(step, Turn):
            if step.input_tokens + step.output_tokens <= max_model_len:
                steps.append(replace(step, index=turn_count))
                turn_count += 1
            continue
        children = tuple(
            (delay, kept)
            for delay, child in step.children
            if (kept := _filtered(child, max_model_len)) is not None
        )
        if children:
            steps.append(SubAgentSpawn(children=children))
    if not steps:
        return None
    return replace(conversation, steps=tuple(steps))


def first_turns(conversations: Iterable[Conversation], count: int) -> list[Conversation]:
    """Each conversation's first `count` turns (sub-agents spawned before the last one kept, each
    cut alike), so a bounded run replays every session's start instead of one long session's
    tail while the others are done."""
    if count < 1:
        raise ValueError(f"turns per conversation {count} must be >= 1")
    return [_first(c, count) for c in conversations]


def _first(conversation: Conversation, count: int) -> Conversation:
    steps: list[Turn | SubAgentSpawn] = []
    kept = 0
    for step in conversation.steps:
        if kept == count:
            break
        if isinstance(step, Turn):
            kept += 1
            steps.append(step)
        else:
            children = tuple((delay, _first(child, count)) for delay, child in step.children)
            steps.append(SubAgentSpawn(children=children))
    return replace(conversation, steps=tuple(steps))


def cap_output_tokens(conversations: Iterable[Conversation], cap: int) -> list[Conversation]:
    """Every turn's output cut to at most `cap` tokens (sub-agents too). Prompts keep the
    trace's lengths, so prefix reuse is untouched; decode time, which reuse does not depend
    on, shrinks, so a bounded run replays more turns."""
    if cap < 1:
        raise ValueError(f"max output tokens {cap} must be >= 1")
    return [_capped(c, cap) for c in conversations]


def _capped(conversation: Conversation, cap: int) -> Conversation:
    steps: list[Turn | SubAgentSpawn] = []
    for step in conversation.steps:
        if isinstance(step, Turn):
            steps.append(replace(step, output_tokens=min(step.output_tokens, cap)))
        else:
            children = tuple((delay, _capped(child, cap)) for delay, child in step.children)
            steps.append(SubAgentSpawn(children=children))
    return replace(conversation, steps=tuple(steps))


def trace_order(conversations: Iterable[Conversation]) -> Iterator[tuple[str, Turn]]:
    """Every turn of every conversation (sub-agents included) as (conversation id, turn), in
    trace arrival order; ties keep reading order."""
    flat = [
        (turn.arrival_s, position, conversation.conversation_id, turn)
        for position, conversation in enumerate(
            c for root in conversations for c in root.all_conversations()
        )
        for turn in conversation.turns()
    ]
    flat.sort(key=lambda item: (item[0], item[1], item[3].index))
    for _, _, conversation_id, turn in flat:
        yield conversation_id, turn
