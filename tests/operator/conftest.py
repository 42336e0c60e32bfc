"""Fixtures that run the real operator against kmock's in-memory Kubernetes API on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest
import yaml
from operator_testkit import load_crd

# Fast timer ticks for tests; read when the handlers module is imported.
os.environ.setdefault("KVFLEET_OPERATOR_TICK_SECONDS", "0.3")
# How long the operator may take to stop by itself before the test cancels it.
HUNG_TASK_GRACE_SECONDS = 1.0
STOP_TIMEOUT_SECONDS = 30.0
_NO_CODE = (lambda: None).__code__


@pytest.fixture
def k8s(kmock):
    """kmock with the built-in resources and the KVFleet CRD (status subresource) declared."""
    import kmock as kmock_lib

    kmock.resources.load_bundled()
    crd = load_crd()
    names, version = crd["spec"]["names"], crd["spec"]["versions"][0]
    key = f"{crd['spec']['group']}/{version['name']}/{names['plural']}"
    kmock.resources[key] = kmock_lib.ResourceInfo(
        kind=names["kind"],
        singular=names["singular"],
        namespaced=True,
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        shortnames=set(names["shortNames"]),
        subresources=set(version["subresources"]),
    )
    return kmock


@pytest.fixture
def kubeconfig(k8s, tmp_path, monkeypatch):
    """A kubeconfig pointing at kmock, where both kopf and the operator's client look."""
    import kubernetes.config.kube_config

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": str(k8s.url).rstrip("/")}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
        "current-context": "kmock",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    # The client computed its default location at import time: point that at the file too.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    return path


@pytest.fixture
async def operator(kubeconfig, k8s):
    """The operator's handlers running in kopf, in this event loop, until the test ends."""
    import kopf
    import kvfleet.operator.handlers  # noqa: F401  (registers the handlers)

    settings = kopf.OperatorSettings()
    settings.watching.connect_timeout = 5
    settings.networking.request_timeout = 10
    settings.batching.idle_timeout = 0.5  # workers exit fast when the test stops the operator
    settings.batching.exit_timeout = 2
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            clusterwide=True, standalone=True, settings=settings,
            stop_flag=stop, ready_flag=ready, memo=kopf.Memo(),
        )
    )  # fmt: skip
    await asyncio.wait_for(ready.wait(), timeout=10)
    yield task
    await stop_operator(task, stop, settings)


def _kopf_tasks() -> list[asyncio.Task]:
    """kopf's tasks still running in this loop (workers it orphaned on stop, for instance)."""
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done()
        and task is not asyncio.current_task()
        and f"{os.sep}kopf{os.sep}" in getattr(task.get_coro(), "cr_code", _NO_CODE).co_filename
    ]


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
