"""Which blocks of each life cycle a tier holds, LRU-ordered within a capacity in pages.

No bytes: slot `s` of life cycle `lc` is where a byte store keeps the block (host row `s`); the
simulator uses the same index with no store. One writer: the manager's owner thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

from ..block_pool import IntegrityError


class TierIndex:
    """Block hash -> slot per life cycle, oldest first; pinned blocks are never evicted, and
    `kept` blocks (inside a client's cache TTL) only when every other unpinned one is gone."""

    def __init__(
        self,
        tier: str,
        capacity_pages: Mapping[str, int],
        kept: Callable[[int], bool] = lambda block_hash: False,
    ) -> None:
        bad = {name: pages for name, pages in capacity_pages.items() if pages < 0}
        if bad:
            raise ValueError(f"tier {tier!r}: capacities must be >= 0, got {bad}")
        self.tier = tier
        self.capacity = dict(capacity_pages)
        self._slots: dict[str, OrderedDict[int, int]] = {n: OrderedDict() for n in self.capacity}
        self._free: dict[str, list[int]] = {
            n: list(range(c))[::-1] for n, c in self.capacity.items()
        }
        self._pinned: dict[str, set[int]] = {name: set() for name in self.capacity}
        self._kept = kept
        # Bumped whenever a block comes or goes (`lookup` may answer differently after).
        self.version = 0

    def lookup(self, life_cycle: str, block_hash: int) -> int | None:
        """The slot holding the block, or None (no mutation)."""
        slots = self._slots.get(life_cycle)
        return None if slots is None else slots.get(block_hash)

    def num_blocks(self, life_cycle: str) -> int:
        """Blocks of `life_cycle` held now."""
        return len(self._slots[life_cycle])

    def hashes(self, life_cycle: str) -> list[int]:
        """Blocks of `life_cycle`, the next to be evicted first."""
        return list(self._slots[life_cycle])

    def touch(self, life_cycle: str, block_hash: int) -> None:
        """Mark a held block as most recently used."""
        self._slots[life_cycle].move_to_end(block_hash)

    def insert(self, life_cycle: str, block_hash: int) -> tuple[int | None, list[tuple[int, int]]]:
        """Give a new block a slot, evicting the oldest unpinned (`_victim`); (None, []) if none
        can be freed.

        Returns the slot and the evicted `(block_hash, slot)` pairs, oldest first.
        """
        slots = self._slots.get(life_cycle)
        if slots is None or self.capacity[life_cycle] == 0:
            return None, []
        if block_hash in slots:
            raise ValueError(f"tier {self.tier!r}: block {block_hash:#x} of {life_cycle!r} held")
        evicted: list[tuple[int, int]] = []
        if not self._free[life_cycle]:
            victim = self._victim(life_cycle)
            if victim is None:
                return None, []
            evicted.append((victim, slots.pop(victim)))
            self._free[life_cycle].append(evicted[0][1])
        slot = self._free[life_cycle].pop()
        slots[block_hash] = slot
        self.version += 1
        return slot, evicted

    def _victim(self, life_cycle: str) -> int | None:
        """The oldest unpinned block outside a cache TTL, else the oldest unpinned one."""
        pinned, oldest = self._pinned[life_cycle], None
        for block_hash in self._slots[life_cycle]:  # stops at the first one outside a TTL
            if block_hash in pinned:
                continue
            if not self._kept(block_hash):
                return block_hash
            oldest = block_hash if oldest is None else oldest
        return oldest

    def remove(self, life_cycle: str, block_hash: int) -> int | None:
        """Forget a block (a bad file, a failed read); its slot becomes free."""
        slot = self._slots[life_cycle].pop(block_hash, None)
        if slot is not None:
            self._free[life_cycle].append(slot)
            self._pinned[life_cycle].discard(block_hash)
            self.version += 1
        return slot

    def pin(self, life_cycle: str, block_hash: int) -> None:
        """Keep a held block from eviction until `unpin` (while its bytes are being read)."""
        if block_hash not in self._slots[life_cycle]:
            raise ValueError(f"tier {self.tier!r}: pin of absent block {block_hash:#x}")
        self._pinned[life_cycle].add(block_hash)

    def pinned(self, life_cycle: str, block_hash: int) -> bool:
        """Whether the block is pinned now (its bytes are being read)."""
        return block_hash in self._pinned[life_cycle]

    def num_pinned(self) -> int:
        """Blocks pinned now, over all life cycles."""
        return sum(len(pinned) for pinned in self._pinned.values())

    def unpin_all(self) -> None:
        """Release every pin."""
        for pinned in self._pinned.values():
            pinned.clear()

    def check_integrity(self) -> None:
        """Raise IntegrityError unless held + free slots = capacity with no slot twice."""
        for name, capacity in self.capacity.items():
            held, free = list(self._slots[name].values()), self._free[name]
            if len(held) + len(free) != capacity or set(held) & set(free):
                raise IntegrityError(
                    f"tier {self.tier!r} {name!r}: {len(held)} held + {len(free)} free slots "
                    f"!= capacity {capacity} or a slot is both"
                )
            if len(set(held)) != len(held) or any(not 0 <= s < capacity for s in held + free):
                raise IntegrityError(f"tier {self.tier!r} {name!r}: slot reused or out of range")
            if not self._pinned[name] <= set(self._slots[name]):
                raise IntegrityError(f"tier {self.tier!r} {name!r}: a pinned block is not held")
