"""The virtual clock: events fire in time order once the loop is idle; sleeps cost no time."""

from __future__ import annotations

import asyncio
import time

import pytest
from kvfleet.services.replay.sim_clock import ClockInUseError, VirtualClock


async def test_sleepers_wake_in_virtual_time_order() -> None:
    """If this fails, concurrent sessions wake out of order or at the wrong virtual time."""
    clock = VirtualClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    started = time.perf_counter()
    await asyncio.gather(sleeper("late", 3600.0), sleeper("early", 1.5), sleeper("mid", 60.0))
    assert woke == [("early", 1.5), ("mid", 60.0), ("late", 3600.0)]
    assert time.perf_counter() - started < 1.0
    clock.close()


async def test_ties_fire_in_scheduling_order_and_cancel_skips() -> None:
    """If this fails, simultaneous events fire in an order that changes between runs."""
    clock = VirtualClock()
    fired: list[str] = []
    for name in ("a", "b", "c"):
        clock.call_at(2.0, lambda name=name: fired.append(name))
    clock.call_at(2.0, lambda: fired.append("x")).cancel()
    await clock.sleep(5.0)
    assert fired == ["a", "b", "c"]
    assert clock.now() == 5.0
    clock.close()


async def test_second_live_clock_on_one_loop_is_refused() -> None:
    """If this fails, two simulations share a loop and spin forever instead of failing."""
    first, second = VirtualClock(), VirtualClock()
    first.call_at(10.0, lambda: None)
    with pytest.raises(ClockInUseError, match="1 pending events"):
        second.call_at(1.0, lambda: None)
    first.close()
    second.call_at(1.0, lambda: None)
    second.close()


async def test_a_failing_event_stops_the_clock_and_is_raised_to_its_watchers() -> None:
    """If this fails, an error in a simulated rank's step leaves every wait hanging for ever."""
    clock = VirtualClock()
    fired: list[str] = []

    def broken() -> None:
        raise ValueError("step broke")

    clock.call_at(1.0, broken)
    clock.call_at(2.0, lambda: fired.append("after"))
    with pytest.raises(RuntimeError, match="event of the simulated fleet failed") as raised:
        await clock.failed()
    assert isinstance(raised.value.__cause__, ValueError)
    assert fired == [] and clock.pending() == 0
    with pytest.raises(RuntimeError, match="clock stopped"):
        clock.call_at(3.0, lambda: None)
    clock.close()
