"""Life cycles: groups of layers with one way of keeping KV, each with its own block pool.

Each kind answers three questions in block indices (block i covers tokens [i*B, (i+1)*B)):
which blocks are needed to resume at k*B tokens, which blocks the running request still needs
after computing n tokens, and which blocks hold state snapshots. The manager asks; it never
branches on the kind.

| kind    | resume at k blocks            | still needed after n tokens   |
|---------|-------------------------------|-------------------------------|
| full    | 0 .. k-1                      | all                           |
| window  | (k*B - w) // B .. k-1         | from (n - w) // B             |
| private | nothing (never committed)     | all                           |
| state   | k-1 (snapshot after block)    | from (n - 1) // B             |

A state life cycle's from-end snapshots are kept until the context ends and retained with the
turn (`from_end_blocks`); its periodic ones are committed and left to the LRU.

`pages_only_where_stored`: a state life cycle needs a page only where a state is stored (the
running state, and the blocks its request commits); every other block of its page table is a
hole (NULL_PAGE). The others need a page at every block the request computes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FullLifeCycle:
    """Every block of the prefix is needed to resume."""

    name: str
    required: bool = True
    kind = "full"
    slides = False  # its first live block moves as tokens are computed
    pages_only_where_stored = False
    reusable = True
    needs_whole_prefix = True
    replay_tokens = 0

    def resume_blocks(self, num_blocks: int, block_size: int) -> range:
        """Blocks needed to resume at `num_blocks * block_size` tokens."""
        return range(num_blocks)

    def first_live_block(self, num_computed_tokens: int, block_size: int) -> int:
        """Blocks before this index are no longer needed by the running request."""
        return 0

    def snapshot_blocks(self, prompt_len: int, block_size: int) -> frozenset[int]:
        """Blocks whose page is a snapshot to commit (state life cycles only)."""
        return frozenset()

    def from_end_blocks(self, prompt_len: int, block_size: int) -> frozenset[int]:
        """Snapshot blocks at offsets from the prompt end (state life cycles only)."""
        return frozenset()


@dataclass(frozen=True)
class WindowLifeCycle:
    """Sliding-window attention over `window_tokens`; reuse stops `replay_tokens` before the end."""

    name: str
    window_tokens: int
    replay_tokens: int = 0
    required: bool = True
    kind = "window"
    slides = True  # its first live block moves as tokens are computed
    pages_only_where_stored = False
    needs_whole_prefix = False
    reusable = True

    def __post_init__(self) -> None:
        if self.window_tokens <= 0 or self.replay_tokens < 0:
            raise ValueError(
                f"window {self.name!r}: window_tokens must be > 0 and replay_tokens >= 0, "
                f"got {self.window_tokens} and {self.replay_tokens}"
            )

    def resume_blocks(self, num_blocks: int, block_size: int) -> range:
        """The endpoint window: blocks covering [k*B - w, k*B)."""
        if num_blocks == 0:
            return range(0)
        return range(max(0, num_blocks * block_size - self.window_tokens) // block_size, num_blocks)

    def first_live_block(self, num_computed_tokens: int, block_size: int) -> int:
        """Blocks wholly before the window of the next token have slid out."""
        return max(0, num_computed_tokens - self.window_tokens) // block_size

    def snapshot_blocks(self, prompt_len: int, block_size: int) -> frozenset[int]:
        """Windows keep no snapshots."""
        return frozenset()

    def from_end_blocks(self, prompt_len: int, block_size: int) -> frozenset[int]:
        """Snapshot blocks at offsets from the prompt end (state life cycles only)."""
        return frozenset()


@dataclass(frozen=True)
class PrivateLifeCycle:
    """Per-request scratch that is never committed for reuse."""

    name: str
    required: bool = True
    kind = "private"
    slides = False  # its first live block moves as tokens are computed
    pages_only_where_stored = False
    needs_whole_prefix = False
    reusable = False
    replay_tokens = 0

    def resume_blocks(self, num_blocks: int, block_size: int) -> range:
        """Nothing: private pages are never found by later requests."""
        return range(0)

    def first_live_block(self, num_computed_tokens: int, block_size: int) -> int:
        """The running request keeps all of its scratch."""
        return 0

    def snapshot_blocks(self, prompt_len: int, block_size: int) -> frozenset[int]:
        """Private life cycles keep no snapshots."""
        return frozenset()

    def from_end_blocks(self, prompt_len: int, block_size: int) -> frozenset[int]:
        """Snapshot blocks at offsets from the prompt end (state life cycles only)."""
        return frozenset()


@dataclass(frozen=True)
class StateLifeCycle:
    """Recurrent state: one page per snapshot boundary plus the running state.

    Boundaries fall every `every_tokens` from the start (0: none) and at each offset from the
    prompt end (block-aligned down), so an offset boundary moves with the prompt.
    """

    name: str
    every_tokens: int = 0
    offsets_from_end: tuple[int, ...] = (0,)
    required: bool = True
    kind = "state"
    slides = True  # its first live block moves as tokens are computed
    pages_only_where_stored = True
    needs_whole_prefix = False
    reusable = True
    replay_tokens = 0

    def __post_init__(self) -> None:
        if self.every_tokens < 0 or any(offset < 0 for offset in self.offsets_from_end):
            raise ValueError(
                f"state {self.name!r}: every_tokens and offsets must be >= 0, got "
                f"{self.every_tokens} and {self.offsets_from_end}"
            )

    def resume_blocks(self, num_blocks: int, block_size: int) -> range:
        """The snapshot taken after block k-1."""
        return range(num_blocks - 1, num_blocks) if num_blocks else range(0)

    def first_live_block(self, num_computed_tokens: int, block_size: int) -> int:
        """Only the block holding the running state is still needed."""
        return max(0, num_computed_tokens - 1) // block_size

    def snapshot_blocks(self, prompt_len: int, block_size: int) -> frozenset[int]:
        """Blocks after which a snapshot boundary falls, for a prompt of `prompt_len` tokens."""
        boundaries: set[int] = set()
        if self.every_tokens:
            boundaries.update(range(self.every_tokens, prompt_len + 1, self.every_tokens))
        boundaries.update((prompt_len - offset) for offset in self.offsets_from_end)
        return frozenset(
            (boundary // block_size) - 1 for boundary in boundaries if boundary >= block_size
        )

    def from_end_blocks(self, prompt_len: int, block_size: int) -> frozenset[int]:
        """Blocks after which a from-end boundary falls: a turn keeps these until its context
        ends and retains them, since each later prompt moves its own from-end boundaries."""
        return frozenset(
            (prompt_len - offset) // block_size - 1
            for offset in self.offsets_from_end
            if prompt_len - offset >= block_size
        )

    @property
    def num_extra_from_end(self) -> int:
        """From-end snapshots besides the endpoint's (at most one block each)."""
        return len({offset for offset in self.offsets_from_end if offset > 0})


LifeCycle = FullLifeCycle | WindowLifeCycle | PrivateLifeCycle | StateLifeCycle
