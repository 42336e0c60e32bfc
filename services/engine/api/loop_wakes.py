"""Waking an event loop's streams from the engine core's thread, one call per burst.

The core queues a token for every stream of its batch in one step. Waking each stream's reader
with its own `call_soon_threadsafe` costs the core thread a write to the loop's self-pipe per
token (~1.2 us) and the loop a callback per token. Here a step's wakes of one loop go in a list
and the loop gets one call that sets them all; a wake that comes while that call is pending
only joins the list.
"""

from __future__ import annotations

import asyncio
import threading
import weakref


class LoopWakes:
    """The stream wakes of one event loop (`wake` from any thread; the sets run on the loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # (a map keyed by loops holds these)
        self._lock = threading.Lock()
        self._events: list[asyncio.Event] = []
        self._scheduled = False  # a call to `_set_all` is on its way to the loop

    def wake(self, event: asyncio.Event) -> None:
        """Set `event` on the loop soon (nothing once the loop closed)."""
        with self._lock:
            self._events.append(event)
            if self._scheduled:
                return
            self._scheduled = True
        loop = self._loop()
        try:
            if loop is None:
                raise RuntimeError("the loop is gone")
            loop.call_soon_threadsafe(self._set_all)
        except RuntimeError:  # the loop closed: nobody reads these any more
            with self._lock:
                self._events.clear()
                self._scheduled = False

    def _set_all(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            self._scheduled = False
        for event in events:
            event.set()
