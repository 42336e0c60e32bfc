"""A fixed-capacity pool of page ids for one life cycle: ref counts, hash index, LRU.

The pool is the only writer of its free list, ref counts and hash index; the manager changes them
only through these methods. It knows nothing of requests. Storage is separate: a tier backs page
id `p` with row `p` of its own tensor `[num_pages, page_size, ...]`.

Page states (every page but the null page is in exactly one):

| state    | ref count | committed (in hash index) | where             |
|----------|-----------|---------------------------|-------------------|
| free     | 0         | no                        | `_free`           |
| cached   | 0         | yes                       | `_evictable` (LRU)|
| in use   | > 0       | either                    | held by callers   |
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import cast

from .events import KVEvent, KVEventKind, KVEventListener, ignore_event

# NOTE: page 0 of every pool is reserved as the null page. Page tables put it where a window
# slid out (or a state life cycle keeps no snapshot), so they stay position-aligned; the engine
# never reads it because those positions are masked out.
NULL_PAGE = 0


# on_evict(page, block_hash): a cached page is about to be reused by `take` (tiers offload it).
EvictionHook = Callable[[int, int], None]


def _keep_nothing(page: int, block_hash: int) -> None:
    """The default eviction hook: an evicted block is simply gone."""


class PoolExhaustedError(RuntimeError):
    """More pages were asked of a pool than it could free; callers check `can_take` first."""


class IntegrityError(RuntimeError):
    """A pool's counts or ref counts disagree with its holders (a bug, never bad input)."""


class BlockPool:
    """Page ids 1..num_pages-1 with ref counts, a block-hash index and LRU eviction."""

    def __init__(
        self,
        life_cycle: str,
        num_pages: int,
        listener: KVEventListener = ignore_event,
        on_evict: EvictionHook = _keep_nothing,
    ) -> None:
        if num_pages < 2:
            raise ValueError(f"pool {life_cycle!r} needs >= 2 pages (1 is null), got {num_pages}")
        self.life_cycle = life_cycle
        self.num_pages = num_pages
        self._listener = listener
        self._on_evict = on_evict
        self._ref_counts = [0] * num_pages
        self._page_hash: list[int | None] = [None] * num_pages
        self._index: dict[int, int] = {}
        self._free: deque[int] = deque(range(1, num_pages))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        # Bumped whenever the hash index changes (a commit, a forgotten page): a match of
        # this pool is still current while it stays the same.
        self.index_version = 0
        # The index's own lookups, for walks over many blocks in one C-level call (matching):
        # `holds(block_hash)` is `lookup(block_hash) is not None`, `page_or(block_hash, NULL_PAGE)`
        # is `lookup` with NULL_PAGE for None.
        self.holds = self._index.__contains__
        self.page_or = self._index.get
        self.evictable_now = self._evictable.__contains__  # `is_evictable`, one C-level call

    # -- reads ---------------------------------------------------------------------------------

    @property
    def num_usable(self) -> int:
        """Pages that can ever be handed out (all but the null page)."""
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        """Pages with no content."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Committed pages nobody holds (evictable, oldest first)."""
        return len(self._evictable)

    @property
    def num_in_use(self) -> int:
        """Pages with a ref count above zero."""
        return self.num_usable - self.num_free - self.num_cached

    def num_available(self) -> int:
        """Pages `take` can hand out now: free plus evictable."""
        return len(self._free) + len(self._evictable)

    def lookup(self, block_hash: int) -> int | None:
        """The page committed under `block_hash`, or None."""
        return self._index.get(block_hash)

    def ref_count(self, page: int) -> int:
        """How many holders `page` has."""
        return self._ref_counts[page]

    def page_hash(self, page: int) -> int | None:
        """The block hash `page` is committed under, or None."""
        return self._page_hash[page]

    def is_evictable(self, page: int) -> bool:
        """True if `page` is committed and unheld (would be reclaimed by `take`)."""
        return page in self._evictable

    def cached_pages(self) -> list[int]:
        """Evictable pages, the next one to be evicted first."""
        return list(self._evictable)

    # -- writes --------------------------------------------------------------------------------

    def can_take(self, num_pages: int) -> bool:
        """True if `take(num_pages)` would succeed."""
        return num_pages <= self.num_available()

    def take(self, num_pages: int) -> list[int]:
        """Hand out `num_pages` pages with ref count 1: free pages first, then evict LRU."""
        if not self.can_take(num_pages):
            raise PoolExhaustedError(
                f"pool {self.life_cycle!r}: asked {num_pages} pages, {len(self._free)} free + "
                f"{len(self._evictable)} evictable of {self.num_usable}"
            )
        pages = []
        for _ in range(num_pages):
            if self._free:
                page = self._free.popleft()
            else:
                page, _ = self._evictable.popitem(last=False)
                # NOTE: the hook runs before `removed` is announced, so tiers can tell whether
                # the block is still held on this rank.
                self._on_evict(page, cast(int, self._page_hash[page]))  # evictable: committed
                self._forget(page)
            self._ref_counts[page] = 1
            pages.append(page)
        return pages

    def ref(self, page: int) -> None:
        """Add a holder to a committed or in-use page (a cache hit or a retention)."""
        if self._ref_counts[page] == 0:
            if page not in self._evictable:
                raise ValueError(f"pool {self.life_cycle!r}: page {page} is free, cannot ref it")
            del self._evictable[page]
        self._ref_counts[page] += 1

    def ref_all(self, pages: Iterable[int]) -> None:
        """`ref(page)` for each page but NULL_PAGE, in order, in one call (an admission refs
        its whole matched prefix)."""
        counts, evictable = self._ref_counts, self._evictable
        for page in pages:
            if page == NULL_PAGE:
                continue
            count = counts[page]
            if count == 0:
                if page not in evictable:
                    raise ValueError(
                        f"pool {self.life_cycle!r}: page {page} is free, cannot ref it"
                    )
                del evictable[page]
            counts[page] = count + 1

    def release_all(self, pages: Iterable[int]) -> None:
        """`release(page)` for each page but NULL_PAGE, in order, in one call (a request's end
        releases its whole page table)."""
        counts, evictable, free, page_hash = (
            self._ref_counts,
            self._evictable,
            self._free,
            self._page_hash,
        )
        for page in pages:
            if page == NULL_PAGE:
                continue
            count = counts[page]
            if count <= 0:
                raise ValueError(f"pool {self.life_cycle!r}: page {page} released with ref {count}")
            counts[page] = count - 1
            if count == 1:
                if page_hash[page] is None:
                    free.append(page)
                else:
                    evictable[page] = None

    def release(self, page: int) -> None:
        """Drop a holder; an unheld page becomes evictable if committed, else free."""
        count = self._ref_counts[page]
        if count <= 0:
            raise ValueError(f"pool {self.life_cycle!r}: page {page} released with ref {count}")
        self._ref_counts[page] = count - 1
        if count == 1:
            if self._page_hash[page] is None:
                self._free.append(page)
            else:
                self._evictable[page] = None

    def commit(self, page: int, block_hash: int) -> bool:
        """Make a held page findable under `block_hash`; False if another page already is."""
        if self._ref_counts[page] <= 0:
            raise ValueError(f"pool {self.life_cycle!r}: commit of unheld page {page}")
        if self._page_hash[page] is not None or block_hash in self._index:
            return False
        self._page_hash[page] = block_hash
        self._index[block_hash] = page
        self.index_version += 1
        self._listener(KVEvent(KVEventKind.STORED, self.life_cycle, block_hash))
        return True

    def drop(self, page: int) -> None:
        """Return an unheld committed page to the free list now (a drop plan's action)."""
        if page not in self._evictable:
            raise ValueError(
                f"pool {self.life_cycle!r}: drop of page {page} with ref {self._ref_counts[page]}"
            )
        del self._evictable[page]
        self._forget(page)
        self._free.append(page)

    def _forget(self, page: int) -> None:
        block_hash = self._page_hash[page]
        if block_hash is None:
            return
        self._page_hash[page] = None
        del self._index[block_hash]
        self.index_version += 1
        self._listener(KVEvent(KVEventKind.REMOVED, self.life_cycle, block_hash))

    # -- invariants ----------------------------------------------------------------------------

    def check_integrity(self, holders: Mapping[int, int] | Iterable[int] = ()) -> None:
        """Raise IntegrityError unless free + cached + in use = usable and refs match `holders`.

        `holders` counts, per page, how many page-table slots and retentions hold it.
        """
        expected = holders if isinstance(holders, Mapping) else Counter(holders)
        free, cached = set(self._free), set(self._evictable)
        in_use = {page for page in range(1, self.num_pages) if self._ref_counts[page] > 0}
        counts = f"free {len(free)} + cached {len(cached)} + in use {len(in_use)}"
        if len(free) + len(cached) + len(in_use) != self.num_usable:
            raise IntegrityError(f"pool {self.life_cycle!r}: {counts} != {self.num_usable}")
        if free & cached or free & in_use or cached & in_use or len(free) != len(self._free):
            raise IntegrityError(f"pool {self.life_cycle!r}: a page is in two states ({counts})")
        if NULL_PAGE in expected or self._ref_counts[NULL_PAGE] != 0:
            raise IntegrityError(f"pool {self.life_cycle!r}: the null page is held")
        for page in range(1, self.num_pages):
            if self._ref_counts[page] != expected.get(page, 0):
                raise IntegrityError(
                    f"pool {self.life_cycle!r}: page {page} has ref {self._ref_counts[page]} "
                    f"but {expected.get(page, 0)} holders ({counts})"
                )
            block_hash = self._page_hash[page]
            if page in free and block_hash is not None:
                raise IntegrityError(f"pool {self.life_cycle!r}: free page {page} is committed")
            if block_hash is not None and self._index.get(block_hash) != page:
                raise IntegrityError(f"pool {self.life_cycle!r}: page {page} not indexed")
        if any(self._page_hash[page] is None for page in cached):
            raise IntegrityError(f"pool {self.life_cycle!r}: an uncommitted page is cached")
        if len(self._index) != sum(hash_ is not None for hash_ in self._page_hash):
            raise IntegrityError(f"pool {self.life_cycle!r}: index size disagrees with pages")
