"""The autoscaler end to end: the operator's timer scrapes real /metrics pages of the router and
engine pods, decides, patches replicas, marks leaving pods, and records status and Events.

Pods live in kmock (no kubelet makes them), each with a loopback podIP of its own
(127.0.0.x: Linux routes all of 127/8 to lo), where a prometheus-client HTTP server serves its
page on the fleet's metrics port. The router page is the router's own `RouterMetrics`; the
engine pages are gauges of the names `tests/engine/test_engine_operator_contract.py` proves an
engine rank exposes.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator

import pytest
from kvfleet.operator.metrics import KV_USAGE, RETAINED
from kvfleet.operator.names import DRAINING_ANNOTATION, FleetRef
from kvfleet.services.router.metrics import RouterMetrics
from operator_testkit import FLEETS, NAMESPACE, eventually
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from test_operator_handlers import FLEET_PATH, STS, check_children_owned, fleet_body, live, send

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

# Short timings so a whole decision cycle takes a few seconds (the timer ticks every 0.5 s).
# The window must hold MIN_SAMPLES samples even when a loaded machine stretches each tick to
# a second or more, or the autoscaler (rightly) holds for lack of samples forever.
AUTOSCALING = {
    "enabled": True,
    "intervalSeconds": 0.5,
    "windowSeconds": 5.0,
    "scaleInBelow": 0.5,
    "scaleOutCooldownSeconds": 0,
    "scaleInCooldownSeconds": 0,
    "maxStep": 1,
    "context": {"minReplicas": 1, "maxReplicas": 3},
    "generation": {"minReplicas": 1, "maxReplicas": 3},
}
# Waits are for the decision, not for a time: generous, so a loaded CI machine only waits longer.
DECISION_TIMEOUT = 120.0
DEFERRALS_PER_SECOND = 4.0  # the default target is 0.5/s: pressure 8
FEED_STEP_SECONDS = 0.05


class RouterPage:
    """The router's real metrics, served on 127.0.0.1; deferrals past the bound fed at a rate."""

    def __init__(self) -> None:
        self.metrics = RouterMetrics()
        self.server, _ = start_http_server(0, "127.0.0.1", registry=self.metrics.registry)
        self.port = self.server.server_port
        self.rate = 0.0
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()

    def _feed(self) -> None:
        while not self._stop.wait(FEED_STEP_SECONDS):
            if self.rate:
                self.metrics.deferrals_past_bound.inc(self.rate * FEED_STEP_SECONDS)

    def close(self) -> None:
        self._stop.set()
        self._feeder.join(timeout=5)
        self.server.shutdown()
        self.server.server_close()


class EnginePage:
    """One engine pod's autoscaling gauges, served on its own loopback address."""

    def __init__(self, host: str, port: int, kv_usage: float, retained: float) -> None:
        registry = CollectorRegistry()
        Gauge(KV_USAGE, "KV usage", registry=registry).set(kv_usage)
        Gauge(RETAINED, "Retained working set", registry=registry).set(retained)
        self.server, _ = start_http_server(port, host, registry=registry)
        self.port = self.server.server_port

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class PodPages:
    """Metrics servers of one test; closed at the end whatever happened."""

    def __init__(self) -> None:
        self.router = RouterPage()
        self.engines: list[EnginePage] = []
        self._next_host = 2

    def engine(self, kv_usage: float = 0.1, retained: float = 0.1) -> str:
        """Serve one engine page on a fresh loopback address; returns that podIP."""
        host = f"127.0.0.{self._next_host}"
        self._next_host += 1
        port = self.engines[0].port if self.engines else 0  # one metrics port for the fleet
        self.engines.append(EnginePage(host, port, kv_usage, retained))
        return host

    @property
    def engine_port(self) -> int:
        return self.engines[0].port

    def close(self) -> None:
        self.router.close()
        for page in self.engines:
            page.close()


@pytest.fixture
def pages() -> Iterator[PodPages]:
    pages = PodPages()
    yield pages
    pages.close()


async def add_pod(k8s, fleet: FleetRef, name: str, component: str, ip: str) -> None:
    """A running pod as the StatefulSet/Deployment would make it: labels and a podIP."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": fleet.labels(component),
        },
        "spec": {"containers": [{"name": "main", "image": "kvfleet"}]},
        "status": {"phase": "Running", "podIP": ip},
    }
    await send(k8s, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body)


async def start_fleet(
    k8s, pages: PodPages, name: str, pools: dict[str, list[float]], drain_seconds: int = 1
) -> FleetRef:
    """A fleet with autoscaling on, one pod per listed KV usage in each pool, and a router."""
    fleet = FleetRef(name, NAMESPACE, f"uid-{name}")
    await add_pod(k8s, fleet, f"{name}-router-0", "router", "127.0.0.1")
    for pool, usages in pools.items():
        for ordinal, usage in enumerate(usages):
            ip = pages.engine(kv_usage=usage)
            await add_pod(k8s, fleet, f"{name}-{pool}-{ordinal}", f"engine-{pool}", ip)
    spec = {
        "model": {"name": "tiny", "path": "/models/tiny"},
        "pools": {
            pool: {"replicas": len(usages)} if usages else {"enabled": False}
            for pool, usages in (("context", []), *pools.items())
        },
        "autoscaling": copy.deepcopy(AUTOSCALING),
        "ports": {"routerMetrics": pages.router.port, "engineMetrics": pages.engine_port},
        "drainSeconds": drain_seconds,
    }
    await send(k8s, "POST", FLEET_PATH, fleet_body(name, spec, uid=fleet.uid))
    await eventually(lambda: live(k8s, STS, fleet.child_name(next(iter(pools)))))
    return fleet


def autoscaling_status(k8s, name: str, pool: str) -> dict:
    return live(k8s, FLEETS, name).get("status", {}).get("autoscaling", {}).get(pool, {})


def last_action(k8s, name: str, pool: str) -> str | None:
    return autoscaling_status(k8s, name, pool).get("lastDecision", {}).get("action")


def sts_replicas(k8s, fleet: FleetRef, pool: str) -> int:
    return live(k8s, STS, fleet.child_name(pool))["spec"]["replicas"]


def pod_annotations(k8s, name: str) -> dict:
    return live(k8s, "v1/pods", name)["metadata"].get("annotations") or {}


def events(k8s, reason: str) -> list[str]:
    """Messages of the Events the operator posted with this reason, in order.

    Read from the requests, not the stored objects: kmock ignores `generateName`, so it keeps
    only the first Event kopf posts.
    """
    return [
        request.data["message"]
        for request in list(k8s["post"])
        if request.resource is not None
        and request.resource.plural == "events"
        and request.data.get("reason") == reason
    ]


async def first_events(k8s, reason: str, count: int) -> list[str]:
    """The first `count` Event messages with this reason, once kopf has posted them.

    kopf posts Events from a background queue, so they may land after the patch they describe.
    """
    return (await eventually(lambda: events(k8s, reason)[count - 1 :] and events(k8s, reason)))[
        :count
    ]


async def test_sustained_deferrals_scale_the_pool_out(k8s, operator, pages):
    """Deferrals past the bound read from the router's page would not add a rank if any link
    of scrape -> decide -> patch -> record were broken."""
    fleet = await start_fleet(k8s, pages, "as1", {"generation": [0.1, 0.1]})
    pages.router.rate = DEFERRALS_PER_SECOND
    await eventually(lambda: sts_replicas(k8s, fleet, "generation") == 3, timeout=DECISION_TIMEOUT)
    await eventually(lambda: autoscaling_status(k8s, "as1", "generation")["replicas"] == 3)
    recorded = autoscaling_status(k8s, "as1", "generation")
    assert recorded["lastDecision"]["action"] in ("scale_out", "hold")  # later ticks hold at max
    [message] = await eventually(lambda: events(k8s, "AutoscaleGeneration"))
    assert message.startswith("scale_out: 2->3: pressure ")
    assert not any(pod_annotations(k8s, f"as1-generation-{i}") for i in range(2))
    check_children_owned(k8s, "as1", fleet.uid)


async def test_idle_pool_drains_its_last_rank_before_scaling_in(k8s, operator, pages):
    """Scale-in would cut a rank with live pins if it lowered replicas before the drain mark."""
    fleet = await start_fleet(k8s, pages, "as2", {"generation": [0.1, 0.1, 0.1]})
    await eventually(
        lambda: last_action(k8s, "as2", "generation") == "begin_drain", timeout=DECISION_TIMEOUT
    )
    assert pod_annotations(k8s, "as2-generation-2") == {DRAINING_ANNOTATION: "true"}
    assert pod_annotations(k8s, "as2-generation-1") == {}
    assert sts_replicas(k8s, fleet, "generation") == 3  # still serving while it drains
    drain = autoscaling_status(k8s, "as2", "generation")["drain"]
    assert drain["targetReplicas"] == 2
    await eventually(lambda: sts_replicas(k8s, fleet, "generation") == 2, timeout=DECISION_TIMEOUT)
    messages = await first_events(k8s, "AutoscaleGeneration", 2)
    assert messages[0].startswith("begin_drain: draining 3->2: pressure ")
    assert messages[1] == "finish_drain: drained 3->2"
    check_children_owned(k8s, "as2", fleet.uid)


async def test_returning_load_cancels_a_drain_and_clears_the_mark(k8s, operator, pages):
    """A drain that outlived returning load would take a rank away from a busy fleet."""
    fleet = await start_fleet(k8s, pages, "as3", {"generation": [0.1, 0.1]}, drain_seconds=60)
    await eventually(lambda: pod_annotations(k8s, "as3-generation-1"), timeout=DECISION_TIMEOUT)
    pages.router.rate = DEFERRALS_PER_SECOND
    await eventually(lambda: not pod_annotations(k8s, "as3-generation-1"), timeout=DECISION_TIMEOUT)
    assert last_action(k8s, "as3", "generation") in ("cancel_drain", "scale_out", "hold")
    messages = await first_events(k8s, "AutoscaleGeneration", 2)
    assert [m.split(":")[0] for m in messages] == ["begin_drain", "cancel_drain"]
    assert sts_replicas(k8s, fleet, "generation") >= 2
    check_children_owned(k8s, "as3", fleet.uid)


async def test_engine_signals_count_only_for_their_own_pool(k8s, operator, pages):
    """A pool would scale on another pool's KV pressure (or on one pod instead of the mean)."""
    pools = {"context": [0.86, 1.0], "generation": [0.1]}  # context mean 0.93 > 0.9 target
    fleet = await start_fleet(k8s, pages, "as4", pools)
    await eventually(lambda: sts_replicas(k8s, fleet, "context") == 3, timeout=DECISION_TIMEOUT)
    assert sts_replicas(k8s, fleet, "generation") == 1  # low, but at minReplicas: holds
    assert last_action(k8s, "as4", "generation") == "hold"
    assert events(k8s, "AutoscaleGeneration") == []
    [message] = events(k8s, "AutoscaleContext")
    assert message.startswith("scale_out: 2->3: pressure 1.03")
    check_children_owned(k8s, "as4", fleet.uid)
