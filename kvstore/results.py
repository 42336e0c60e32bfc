"""Small frozen results the manager hands out; callers never see its mutable state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Where a matched block is: on the device (its page is in `pages`), or on a lower tier (its page
# is NULL_PAGE until admission onboards it); "" where the life cycle does not need the block.
LOWER_TIERS = ("host", "disk")


@dataclass(frozen=True)
class PrefixMatch:
    """The longest prefix every required life cycle can resume from.

    `pages[life_cycle]` has one entry per reused block in token order; NULL_PAGE marks positions
    that life cycle does not need (slid out of a window, between state snapshots, private).
    With tiers, `locations[life_cycle]` says per block "device", "host", "disk" or "" (not
    needed); blocks on host or disk have NULL_PAGE in `pages` until admission onboards them.
    Without tiers `locations` is empty and every needed block is on the device.
    `num_whole_prefix_blocks`: how far (up to the same cap) every required whole-prefix life
    cycle has the prompt cached, 0 with none; past `num_reusable_blocks` it marks a branch point.
    """

    num_reusable_tokens: int
    num_reusable_blocks: int
    pages: Mapping[str, tuple[int, ...]]
    locations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    num_whole_prefix_blocks: int = 0

    def num_lower(self, life_cycle: str) -> int:
        """Blocks of `life_cycle` that admission must onboard from host or disk."""
        where = self.locations.get(life_cycle, ())
        return sum(where.count(tier) for tier in LOWER_TIERS)

    def lower_positions(self) -> list[int]:
        """Block positions where any life cycle's block is on host or disk, in order."""
        return sorted(
            {
                index
                for where in self.locations.values()
                for index, tier in enumerate(where)
                if tier in LOWER_TIERS
            }
        )


@dataclass(frozen=True)
class Allocation:
    """Pages added to a request's page tables by one `admit`/`allocate` call."""

    request_id: str
    num_reused_tokens: int
    num_tokens_with_pages: int
    new_pages: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class TurnRecord:
    """The pages a finished turn's context keeps for its conversation (None: missing page).

    `branch_tokens` is None for a turn's endpoints; for a branch record (`branch_points.py`),
    the branch point its pages resume at.
    """

    conversation_id: str
    request_id: str
    pages: Mapping[str, tuple[int | None, ...]]
    branch_tokens: int | None = None


@dataclass(frozen=True)
class DropPlan:
    """Pages a retained turn gives up and that go back to the free list (nobody else holds them).

    `released` is every page the turn held; `dropped` the subset freed outright.
    """

    conversation_id: str
    request_id: str
    released: Mapping[str, tuple[int, ...]]
    dropped: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class TurnRelease:
    """Refs a retained turn handed to the LRU under memory pressure (nothing is freed).

    `released` is every page the turn held; `evictable` the subset nobody else holds, now
    cached: matchable until the pool evicts it (the tiers offload it then).
    """

    conversation_id: str
    request_id: str
    released: Mapping[str, tuple[int, ...]]
    evictable: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class RequestProgress:
    """A request's reused and computed tokens, its planned checkpoint (None: none) and branch
    points (ascending; empty: none)."""

    admitted: bool
    num_reused_tokens: int
    num_computed_tokens: int
    checkpoint_tokens: int | None
    context_done: bool
    branch_tokens: tuple[int, ...] = ()
