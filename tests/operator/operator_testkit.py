"""Helpers shared by the operator tests (a unique module name: test folders have no packages)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "kvfleet"
CRD_PATH = CHART_DIR / "crds" / "kvfleets.kvfleet.dev.yaml"
POOL_CRD_PATH = CHART_DIR / "crds" / "kvfleetpools.kvfleet.dev.yaml"
EXAMPLE_FLEET = CHART_DIR / "examples" / "fleet.yaml"
NAMESPACE = "ns1"
# How long the operator may take to stop by itself before the test cancels it.
HUNG_TASK_GRACE_SECONDS = 1.0
STOP_TIMEOUT_SECONDS = 30.0
TEST_REQUEST_TIMEOUT_SECONDS = (2.0, 3.0)  # (connect, read) of the operator's API calls
_NO_CODE = (lambda: None).__code__
FLEETS = "kvfleet.dev/v1alpha1/kvfleets"


def load_crd(path: Path = CRD_PATH) -> dict[str, Any]:
    """One of the chart's CRDs (KVFleet by default), so the tests and the chart cannot drift."""
    return yaml.safe_load(path.read_text())


def crd_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the CRD's only version."""
    return load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


async def eventually(check: Callable[[], Any], timeout: float = 60.0, step: float = 0.05) -> Any:
    """Poll `check` until it returns a truthy value (returned) or fail after `timeout` seconds
    (generous: on a loaded machine the operator is slower, and only a failure waits it out)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (KeyError, LookupError, ValueError) as exc:
            last_error = exc
        await asyncio.sleep(step)
    raise AssertionError(f"condition not met within {timeout}s (last error: {last_error!r})")


def _kopf_tasks() -> list[asyncio.Task]:
    """kopf's tasks still running in this loop (workers it orphaned on stop, for instance)."""
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done()
        and task is not asyncio.current_task()
        and f"{os.sep}kopf{os.sep}" in getattr(task.get_coro(), "cr_code", _NO_CODE).co_filename
    ]


async def start_operator(request_timeout: float, ready_timeout: float, **watching: float):
    """kopf running the operator's handlers in this event loop: (task, stop flag, settings).

    Workers exit fast once the test stops the operator (short idle and exit timeouts);
    `watching` sets kopf's watch timeouts (connect_timeout, server_timeout).
    """
    import kopf
    import kvfleet.operator.handlers  # noqa: F401  (registers the handlers)
    from kvfleet.operator.kube import KubeApi

    settings = kopf.OperatorSettings()
    for name, value in {"connect_timeout": 5, **watching}.items():
        setattr(settings.watching, name, value)
    settings.networking.request_timeout = request_timeout
    settings.queueing.idle_timeout = 0.5
    settings.queueing.exit_timeout = 2
    # The emulated API shares the test's event loop and, on a loaded machine, now and then
    # leaves a call unanswered: short timeouts make such a stall cost a few seconds of one
    # tick (the shipped ones bound a real server's stall at 25 s), and the next tick retries.
    memo = kopf.Memo()
    memo.kube = KubeApi.from_environment(request_timeout=TEST_REQUEST_TIMEOUT_SECONDS)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            clusterwide=True, standalone=True, settings=settings,
            stop_flag=stop, ready_flag=ready, memo=memo,
        )
    )  # fmt: skip
    await asyncio.wait_for(ready.wait(), timeout=ready_timeout)
    return task, stop, settings


async def stop_operator(task: asyncio.Task, stop: asyncio.Event, settings) -> None:
    """Stop the operator and everything it started while the mock API still answers.

    kopf returns from its stop with some workers orphaned (a timer racing the stop, a handler
    whose status patch is in flight); left alone they retry against the mock after it closed,
    and the event loop's close (which cancels every task, kopf's shielded scheduler helpers
    too) waits on them forever. So: stop, wait for what is left to finish by itself, and for
    the handler threads, all before the mock's own teardown.
    """
    stop.set()
    # NOTE: a timer spawned by a watch event racing the stop is never stopped, and kopf then
    # waits a fixed 5 s for such "hung" tasks; cancelling the operator cancels them at once.
    done, _ = await asyncio.wait([task], timeout=HUNG_TASK_GRACE_SECONDS)
    if not done:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=STOP_TIMEOUT_SECONDS)
    # Nothing else is cancelled: a cancelled scheduler helper never wakes the watcher's
    # (shielded) close, which is how the event loop's close used to wait for the timeout.
    leftovers = _kopf_tasks()
    for leftover in leftovers:
        if leftover.get_name().startswith("runner of "):
            leftover.cancel()  # an orphaned timer: it never stops by itself
    if leftovers:
        _, pending = await asyncio.wait(leftovers, timeout=STOP_TIMEOUT_SECONDS)
        assert not pending, f"kopf tasks did not stop: {pending}"
    # Sync handlers and the timer's worker thread finish their API calls against the mock.
    if settings.execution.executor is not None:
        await asyncio.to_thread(settings.execution.executor.shutdown, True)
    await asyncio.get_running_loop().shutdown_default_executor()
