"""Build a router: store, admission queue, runtime, gRPC server, health, reflection, metrics."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from kvfleet.proto import router_pb2, router_pb2_grpc
from kvfleet.services.router.admission import GENERATION_ROLES, AdmissionConfig, AdmissionQueue
from kvfleet.services.router.failover_store import FailoverStore
from kvfleet.services.router.metrics import RouterMetrics
from kvfleet.services.router.prefix_index import PrefixIndex
from kvfleet.services.router.redis_store import RedisStore
from kvfleet.services.router.runtime import RouterRuntime
from kvfleet.services.router.service import EngineChannels, RankRegistryServicer, RouterServicer
from kvfleet.services.router.store import AdmissionStore, LocalStore
from kvfleet.services.router.validation import RequestLimits
from prometheus_client import start_http_server

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    router_pb2.DESCRIPTOR.services_by_name["Router"].full_name,
    router_pb2.DESCRIPTOR.services_by_name["RankRegistry"].full_name,
)


@dataclass(frozen=True)
class RouterConfig:
    """Everything `kvfleet router` takes; `redis_url=None` keeps all state in-process."""

    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    limits: RequestLimits = field(default_factory=RequestLimits)
    redis_url: str | None = None
    redis_prefix: str = "kvfleet"
    redis_timeout_seconds: float = 1.0
    router_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    max_queue_seconds: float = 600.0
    tick_seconds: float = 0.05
    max_workers: int = 256
    metrics_port: int | None = None  # None: no /metrics endpoint; 0: any free port


class RouterServer:
    """A running router; `stop` ends gRPC, the admission thread and /metrics."""

    def __init__(
        self,
        grpc_server: grpc.Server,
        runtime: RouterRuntime,
        channels: EngineChannels,
        metrics: RouterMetrics,
        health_servicer: health.HealthServicer,
    ) -> None:
        self.grpc_server = grpc_server
        self.runtime = runtime
        self.metrics = metrics
        self._channels = channels
        self._health = health_servicer
        self._metrics_http: Any = None  # prometheus_client's WSGI server, once serving
        self.metrics_port: int | None = None

    def serve_metrics(self, port: int, address: str = "0.0.0.0") -> int:
        """Serve /metrics from this router's registry; returns the bound port."""
        self._metrics_http, _thread = start_http_server(
            port, address, registry=self.metrics.registry
        )
        self.metrics_port = self._metrics_http.server_port
        return self.metrics_port

    def stop(self, grace: float | None = 5.0) -> None:
        """Refuse new calls, let streams finish for `grace` seconds, then stop everything."""
        self._health.enter_graceful_shutdown()
        self.grpc_server.stop(grace).wait(timeout=(grace or 0) + 5)
        self.runtime.stop()
        self._channels.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self.grpc_server.wait_for_termination(timeout)


def build_store(config: RouterConfig, metrics: RouterMetrics) -> AdmissionStore:
    """Redis with a local fallback when a URL is given, else in-process only."""
    if config.redis_url is None:
        return LocalStore()
    remote = RedisStore.from_url(
        config.redis_url, config.redis_prefix, config.router_id, config.redis_timeout_seconds
    )
    return FailoverStore(
        remote,
        config.admission.pin_ttl_seconds,
        on_redis_error=lambda _error: metrics.redis_errors.inc(),
        on_degraded=lambda degraded: metrics.degraded.set(1 if degraded else 0),
    )


def create_server(
    address: str,
    config: RouterConfig | None = None,
    store: AdmissionStore | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[RouterServer, int]:
    """Start a router on `address` (port 0 picks one); returns the server and its port."""
    config = config or RouterConfig()
    metrics = RouterMetrics()
    store = store if store is not None else build_store(config, metrics)
    prefix_index = PrefixIndex()
    queue = AdmissionQueue(store, config.admission, clock, prefix_index)
    generation_queue = AdmissionQueue(
        store, config.admission, clock, prefix_index, roles=GENERATION_ROLES
    )
    runtime = RouterRuntime(
        queue,
        prefix_index,
        metrics,
        clock,
        config.max_queue_seconds,
        config.tick_seconds,
        generation_queue=generation_queue,
    )
    channels = EngineChannels()
    grpc_server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="router-grpc")
    )
    router_pb2_grpc.add_RouterServicer_to_server(
        RouterServicer(runtime, channels, config.limits, clock), grpc_server
    )
    router_pb2_grpc.add_RankRegistryServicer_to_server(
        RankRegistryServicer(runtime, config.admission.heartbeat_timeout_seconds / 3), grpc_server
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, grpc_server)
    for name in ("", *SERVICE_NAMES):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), grpc_server
    )
    port = grpc_server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the router to {address}")
    runtime.start()
    grpc_server.start()
    server = RouterServer(grpc_server, runtime, channels, metrics, health_servicer)
    if config.metrics_port is not None:
        server.serve_metrics(config.metrics_port)
    log.info(
        "router %s on port %d (affinity %s, placement %s, store %s)",
        config.router_id,
        port,
        config.admission.affinity,
        config.admission.placement,
        type(store).__name__,
    )
    return server, port
