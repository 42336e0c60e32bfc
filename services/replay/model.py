"""The replay workload: conversations of ordered turns, with the prefix blocks of every prompt.

Readers build these; the driver, the token synthesiser and the oracle only read them.
A block is named by a `BlockKey` (namespace, id): equal keys mean equal prefixes, and keys of
different namespaces are never equal, so ids local to one trace file cannot collide.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

# (namespace, id): the identity of one prompt block and, by chaining, of its whole prefix.
BlockKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Turn:
    """One model request of a conversation.

    `hash_ids` are the trace's ids for the prompt blocks in `namespace`. The first
    `shared_prefix_blocks` blocks belong instead to the common chain `shared_namespace`
    (ids 0, 1, 2... by position), which models a prompt prefix shared across sessions.
    `branch_hints`: prompt positions (tokens) where later turns are likely to branch off: where
    the tools and the system prompt end (what the engine's chat path derives from its template).
    `tool_tokens` and `system_tokens`: the sizes of those two leading parts (0 when the trace
    does not say), which chat targets send as tools and a system prompt.
    """

    index: int
    arrival_s: float
    think_time_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    namespace: str
    block_size: int
    shared_prefix_blocks: int = 0
    shared_namespace: str = ""
    branch_hints: tuple[int, ...] = ()
    tool_tokens: int = 0
    system_tokens: int = 0

    def __post_init__(self) -> None:
        if self.input_tokens < 1 or self.output_tokens < 0:
            raise ValueError(
                f"turn {self.index}: input_tokens={self.input_tokens} must be >= 1 and "
                f"output_tokens={self.output_tokens} must be >= 0"
            )
        max_blocks = -(-self.input_tokens // self.block_size)
        if len(self.hash_ids) > max_blocks:
            raise ValueError(
                f"turn {self.index}: {len(self.hash_ids)} blocks of {self.block_size} tokens "
                f"exceed input_tokens={self.input_tokens} (at most {max_blocks} blocks)"
            )
        if not all(0 < hint <= self.input_tokens for hint in self.branch_hints):
            raise ValueError(
                f"turn {self.index}: branch_hints={list(self.branch_hints)} must lie in "
                f"[1, input_tokens={self.input_tokens}]"
            )
        if not 0 <= self.shared_prefix_blocks <= len(self.hash_ids):
            raise ValueError(
                f"turn {self.index}: shared_prefix_blocks={self.shared_prefix_blocks} not in "
                f"[0, {len(self.hash_ids)}]"
            )

    def block_keys(self) -> Iterator[BlockKey]:
        """Yield the key of every prompt block, in prompt order."""
        shared = self.shared_prefix_blocks
        for position in range(shared):
            yield (self.shared_namespace, position)
        namespace = self.namespace
        for block_id in self.hash_ids[shared:]:
            yield (namespace, block_id)


@dataclass(frozen=True, slots=True)
class SubAgentSpawn:
    """Sub-agent conversations started together by a parent; the parent's next turn waits for
    all of them. `delay_s` of each child is its start offset after the parent's previous turn
    finished (trace seconds)."""

    children: tuple[tuple[float, Conversation], ...]

    def conversations(self) -> Iterator[Conversation]:
        """Yield the child conversations in spawn order."""
        for _, child in self.children:
            yield child


@dataclass(frozen=True, slots=True)
class Conversation:
    """A session: turns in order, with sub-agent spawns between them.

    `steps` holds `Turn`s and `SubAgentSpawn`s in the order the trace made them.
    """

    conversation_id: str
    source: str
    steps: tuple[Turn | SubAgentSpawn, ...] = field(default=())

    def turns(self) -> Iterator[Turn]:
        """Yield this conversation's own turns (not those of its sub-agents)."""
        for step in self.steps:
            if isinstance(step, Turn):
                yield step

    def subagents(self) -> Iterator[Conversation]:
        """Yield the sub-agent conversations, depth first, in spawn order."""
        for step in self.steps:
            if isinstance(step, SubAgentSpawn):
                for child in step.conversations():
                    yield child
                    yield from child.subagents()

    def all_conversations(self) -> Iterator[Conversation]:
        """Yield this conversation and every sub-agent conversation below it."""
        yield self
        yield from self.subagents()

    def request_count(self) -> int:
        """Number of model requests, sub-agents included."""
        return sum(sum(1 for _ in c.turns()) for c in self.all_conversations())
