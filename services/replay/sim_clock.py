"""Virtual time for the fleet simulator: an event heap advanced only when asyncio is idle.

The load driver awaits `sleep` and the simulated fleet schedules step ends with `call_at`; both
wait on this clock. A runner task fires the earliest event only once every other task on the
loop is blocked, so a replay of hours of traffic takes the CPU time of its events alone, and
the order of events (ties broken by scheduling order) is the same on every run.

A callback that raises stops the clock: nothing can fire after it, so every wait would hang.
`failed()` raises that error for the driver instead.
"""

from __future__ import annotations

import asyncio
import heapq
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

# Yields before an event fires on a loop that does not expose its ready queue.
_FALLBACK_SETTLE_YIELDS = 64

# The clock whose runner is live on each loop. Two runners would each see the other as ready
# work and never fire, so a second clock on a busy loop is refused instead.
_ACTIVE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, VirtualClock] = (
    weakref.WeakKeyDictionary()
)


class ClockInUseError(RuntimeError):
    """Another virtual clock is running on this event loop."""


@dataclass(order=True)
class ScheduledEvent:
    """One callback at a virtual time; `cancel` keeps it in the heap but makes it a no-op."""

    when: float
    sequence: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        """Do not run the callback."""
        self.cancelled = True


class VirtualClock:
    """Seconds of simulated time; the only writer of its event heap and of `now`."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s
        self._heap: list[ScheduledEvent] = []
        self._sequence = 0
        self._runner: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._failure_waiters: list[asyncio.Future[None]] = []
        self.events_fired = 0

    def now(self) -> float:
        """The current virtual time."""
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> ScheduledEvent:
        """Run `callback` at virtual time `when` (not before now); returns a cancellable handle."""
        self._sequence += 1
        event = ScheduledEvent(max(when, self._now), self._sequence, callback)
        heapq.heappush(self._heap, event)
        self._ensure_runner()
        return event

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of virtual time; non-positive waits return at once."""
        if seconds <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        self.call_at(self._now + seconds, wake)
        await future

    async def failed(self) -> None:
        """Raise the error an event's callback raised, once one has (it stopped the clock)."""
        if self._failure is None:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._failure_waiters.append(waiter)
            try:
                await waiter
            finally:
                self._failure_waiters.remove(waiter)
        raise RuntimeError("an event of the simulated fleet failed") from self._failure

    def pending(self) -> int:
        """Events not yet fired (cancelled ones included)."""
        return len(self._heap)

    def close(self) -> None:
        """Drop every pending event and stop the runner (the simulation is over)."""
        self._heap.clear()
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
        self._runner = None
        loop = asyncio.get_running_loop()
        if _ACTIVE.get(loop) is self:
            del _ACTIVE[loop]

    def _ensure_runner(self) -> None:
        if self._failure is not None:
            raise RuntimeError("the virtual clock stopped: an event failed") from self._failure
        if self._runner is not None and not self._runner.done():
            return
        loop = asyncio.get_running_loop()
        other = _ACTIVE.get(loop)
        busy = other is not None and other._runner is not None and not other._runner.done()
        if busy and other is not self:
            raise ClockInUseError(
                f"another virtual clock has {other.pending()} pending events on this loop; "
                "close it first (one simulated fleet per event loop at a time)"
            )
        _ACTIVE[loop] = self
        self._runner = loop.create_task(self._run())

    async def _run(self) -> None:
        """Fire events one at a time, each once the rest of the loop has nothing to do."""
        loop = asyncio.get_running_loop()
        while self._heap:
            await _settle(loop)
            if not self._heap:
                break
            event = heapq.heappop(self._heap)
            if event.cancelled:
                continue
            self._now = event.when
            self.events_fired += 1
            try:
                event.callback()
            except Exception as error:
                self._failure = error
                self._heap.clear()
                for waiter in self._failure_waiters:
                    if not waiter.done():
                        waiter.set_result(None)
                return


async def _settle(loop: asyncio.AbstractEventLoop) -> None:
    """Return once no other callback is ready to run on `loop`."""
    # NOTE: CPython's event loops keep runnable callbacks in `_ready`; when it is empty after
    # this task resumes, every other task is waiting (on this clock, in a simulation).
    ready = getattr(loop, "_ready", None)
    if ready is None:
        for _ in range(_FALLBACK_SETTLE_YIELDS):
            await asyncio.sleep(0)
        return
    await asyncio.sleep(0)
    while ready:
        await asyncio.sleep(0)
