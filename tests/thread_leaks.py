"""A pytest plugin: a test module fails when a thread it started outlives it.

Threads left running by finished tests keep their servers, channels and heaps alive: later
tests' garbage collections slow down (pauses long enough to miss a heartbeat) and pytest
waits at exit for executors that never finish. So every fixture stops what it started.

The check runs after the teardown of a module's last test, when its module-scoped fixtures
are gone too (no fixture here is wider than a module): every thread started since the
module's first test must have ended within a short grace. The error names each thread's
target, which points at the fixture that did not stop it.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import traceback

import pytest

# How long a module's threads get to end by themselves (a server's stop returns before its
# worker threads have exited).
GRACE_SECONDS = 10.0
# Threads that live for the process by design.
PROCESS_THREADS = ("tqdm._monitor.TMonitor",)
_module_start: dict[str, set[threading.Thread]] = {}


def target_name(thread: threading.Thread) -> str:
    """What the thread runs, as module.qualname."""
    target = getattr(thread, "_target", None)
    if target is None:
        return f"{type(thread).__module__}.{type(thread).__qualname__}"
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"


def where(thread: threading.Thread) -> str:
    """The thread's stack now: what it waits on names what should have stopped it."""
    frame = sys._current_frames().get(thread.ident)
    return "".join(traceback.format_stack(frame, limit=8)) if frame else "(ended)"


def leftover_threads(before: set[threading.Thread], grace: float) -> list[threading.Thread]:
    """Threads started since `before` that are still alive after waiting up to `grace`."""
    # Some threads end when their owner is freed: grpc.aio's completion-queue poller lives
    # until its last channel is deallocated, which a reference cycle defers to a collection.
    gc.collect()
    started = [
        thread
        for thread in threading.enumerate()
        if thread not in before and target_name(thread) not in PROCESS_THREADS
    ]
    deadline = time.monotonic() + grace
    for thread in started:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    return [thread for thread in started if thread.is_alive()]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    _module_start.setdefault(str(item.path), set(threading.enumerate()))
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield
    if os.environ.get("KVFLEET_THREAD_CHECK") == "off":
        return result
    if nextitem is not None and nextitem.path == item.path:
        return result
    before = _module_start.pop(str(item.path), None)
    if before is None:
        return result
    leftover = leftover_threads(before, GRACE_SECONDS)
    if leftover:
        names = "\n".join(f"{t.name} ({target_name(t)}), now at:\n{where(t)}" for t in leftover)
        raise AssertionError(
            f"{len(leftover)} thread(s) started by {item.path.name} outlived it:\n{names}"
        )
    return result


# How long the process may take to exit after pytest is done before it says what it waits on.
EXIT_REPORT_SECONDS = 15.0


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """If the process is still alive EXIT_REPORT_SECONDS after pytest finished (an executor
    joined at exit, a child process waited for, a long final collection), print every
    thread's stack once, so the CI log names what holds the exit."""
    import faulthandler

    faulthandler.dump_traceback_later(EXIT_REPORT_SECONDS, exit=False)
