"""Where a synthesised prompt's parts begin, for targets that send text chat messages.

Token targets send a turn's ids as they are; chat targets (`chat_target.py`,
`messages_target.py`) send the same content as tools, a system prompt and user messages, and
need to know where each part ends. Message boundaries are where earlier turns of the
conversation stopped sharing blocks with later ones (the end of each turn's whole blocks: the
tokens after it are unique to that turn), so every boundary a turn shows is a boundary every
later turn shows too: the first user message stays the same from turn to turn, as Claude
Code's does, and a server's prefix identity (tools, system, first user message) holds still.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .model import Turn


@dataclass(frozen=True)
class PromptLayout:
    """`tokens[:tools_end]` are the tools, `[tools_end:system_end]` the system prompt, and the
    rest user messages, one starting at `system_end` and one at each of `message_starts`."""

    tools_end: int = 0
    system_end: int = 0
    message_starts: tuple[int, ...] = ()


def shared_end(turn: Turn) -> int:
    """The end of the turn's whole blocks: what a later turn can share with it."""
    return min(turn.input_tokens, len(turn.hash_ids) * turn.block_size)


def layout_of(turn: Turn, earlier_ends: Sequence[int]) -> PromptLayout:
    """The layout of `turn`, given the `shared_end` of the conversation's earlier turns."""
    tools_end = min(turn.tool_tokens, turn.input_tokens)
    system_end = min(turn.tool_tokens + turn.system_tokens, turn.input_tokens)
    ends = {*earlier_ends, shared_end(turn)}
    starts = tuple(sorted(end for end in ends if system_end < end < turn.input_tokens))
    return PromptLayout(tools_end, system_end, starts)
