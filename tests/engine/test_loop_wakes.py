"""The core thread's wakes of one event loop's streams: a burst is one call into the loop, and
every stream woken in it is set; a closed loop takes wakes without error and keeps none."""

from __future__ import annotations

import asyncio
import threading

from kvfleet.services.engine.api.loop_wakes import LoopWakes


class CountingLoop(asyncio.SelectorEventLoop):
    """A real event loop that counts the calls other threads make into it."""

    calls = 0

    def call_soon_threadsafe(self, *args, **kwargs):
        self.calls += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def wake_from_a_thread(wakes: LoopWakes, events: list[asyncio.Event]) -> None:
    thread = threading.Thread(target=lambda: [wakes.wake(event) for event in events])
    thread.start()
    thread.join()


def test_a_burst_of_wakes_is_one_call_and_sets_every_stream():
    loop = CountingLoop()
    try:
        wakes = LoopWakes(loop)
        events = [asyncio.Event() for _ in range(256)]  # a decode step's streams
        wake_from_a_thread(wakes, events)
        assert loop.calls == 1
        assert not any(event.is_set() for event in events)  # set on the loop, not the caller
        loop.run_until_complete(asyncio.sleep(0))
        assert all(event.is_set() for event in events)
        later = [asyncio.Event(), asyncio.Event()]
        wake_from_a_thread(wakes, later)  # the next step: a new call
        assert loop.calls == 2
        loop.run_until_complete(asyncio.sleep(0))
        assert all(event.is_set() for event in later)
    finally:
        loop.close()


def test_a_closed_loop_takes_wakes_and_keeps_none():
    loop = CountingLoop()
    wakes = LoopWakes(loop)
    loop.close()
    for _ in range(3):
        wakes.wake(asyncio.Event())  # nobody reads these streams any more
    assert wakes._events == []
