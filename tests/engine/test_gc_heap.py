"""The serving process's startup heap leaves the collector's passes; garbage alive at the
freeze is collected first (frozen, it would never be), and later garbage still is."""

from __future__ import annotations

import gc
import weakref

from kvfleet.services.engine.core.gc_heap import freeze_startup_heap, thaw_heap


class Node:
    """A reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_startup_heap_is_frozen_after_its_garbage_is_collected():
    kept = Node()
    garbage = Node()
    gone_before = weakref.ref(garbage)
    del garbage
    try:
        assert freeze_startup_heap() >= 1
        assert gone_before() is None  # collected, not frozen
        assert all(o is not kept for o in gc.get_objects())  # out of the passes
        later = Node()
        gone_later = weakref.ref(later)
        del later
        gc.collect()
        assert gone_later() is None  # what is made after the freeze is collected as before
    finally:
        thaw_heap()
    assert gc.get_freeze_count() == 0
    assert any(o is kept for o in gc.get_objects())  # back in the collector's passes
