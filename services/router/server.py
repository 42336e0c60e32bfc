"""Build a router: store, admission queue, runtime, gRPC server, health, reflection, metrics."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from ...proto import router_pb2, router_pb2_grpc
from ...proto.pooled_server import PooledServer
from .admission import GENERATION_ROLES, AdmissionConfig, AdmissionQueue
from .failover_store import FailoverStore
from .fleet_secret import RANK_PORT_MESSAGE_BYTES, FleetSecretInterceptor
from .metrics import RouterMetrics
from .prefetch import PrefetchPlanner
from .prefix_index import PrefixIndex
from .redis_connect import RedisSettings, connect
from .redis_store import RedisStore
from .reflection_names import enable_reflection
from .registry_service import RankRegistryServicer
from .replica_lease import ReplicaLease
from .runtime import RouterRuntime
from .service import EngineChannels, RouterServicer
from .store import AdmissionStore, LocalStore
from .stream_watch import StreamWatch
from .validation import RequestLimits

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
    redis_password: str | None = None  # when the URL has none (see redis_connect.py)
    redis_ca_file: str | None = None
    redis_sentinels: tuple[str, ...] = ()
    redis_sentinel_master: str | None = None
    redis_tls: bool = False  # Sentinel: TLS to the master
    redis_retry_seconds: float = 0.5  # while degraded, how often Redis is tried again
    # Reservations of a replica whose lease lapsed (killed) are released by the others.
    lease_seconds: float = 10.0
    # After a resync, how long no rank counts as silent (None: one heartbeat timeout).
    resync_grace_seconds: float | None = None
    pin_sweep_seconds: float = 10.0  # how often expired pins leave memory and rank_pins sets
    router_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    max_queue_seconds: float = 600.0
    # Cap on one forwarded engine call (None: the client's deadline alone, or none).
    max_call_seconds: float | None = None
    # Router-driven prefetch: a home rank brings a conversation's blocks up before its next
    # turn (its own inter-turn gaps say when) and while the turn waits for a slot there. Off:
    # no gain measured on the tuning half (docs/prefetch.md).
    prefetch: bool = False
    # Moving with the KV: a turn placed away from its live home (wait bound, lenient away)
    # names the home to its new rank, which pulls the prompt's blocks it lacks from there
    # instead of recomputing them (docs/prefetch.md, "Moving with the KV").
    migrate_kv: bool = False
    # An engine stream silent this long is cancelled and its rank taken for failed.
    stream_idle_seconds: float = 120.0
    tick_seconds: float = 0.05
    # Threads of the client pool, started on demand: a turn holds one from arrival to its last
    # chunk (queued at the router or streaming), so this bounds one replica's turns in flight;
    # past it a turn waits unqueued, outside the admission order and its deadlines.
    max_workers: int = 2048
    metrics_port: int | None = None  # None: no /metrics endpoint; 0: any free port
    # Rank-facing services (RankRegistry) on their own HOST:PORT (port 0: any); None: on the
    # client port (in-process fleets). With a fleet secret, every RankRegistry call must show it.
    rank_address: str | None = None
    fleet_secret: str | None = None
    # TLS on the client port: PEM certificate chain and key files (both or neither).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def redis_settings(self) -> RedisSettings:
        return RedisSettings(
            url=self.redis_url,
            password=self.redis_password,
            ca_file=self.redis_ca_file,
            sentinels=self.redis_sentinels,
            sentinel_master=self.redis_sentinel_master,
            tls=self.redis_tls,
        )


class RouterServer:
    """A running router; `stop` ends gRPC, the admission thread and /metrics."""

    def __init__(
        self,
        grpc_server: grpc.Server,
        runtime: RouterRuntime,
        channels: EngineChannels,
        metrics: RouterMetrics,
        health_servicer: health.HealthServicer,
        lease: ReplicaLease | None = None,
        watch: StreamWatch | None = None,
        rank_server: grpc.Server | None = None,
    ) -> None:
        self._watch = watch
        self.rank_server = rank_server
        self.rank_port: int | None = None  # where RankRegistry listens (None: the client port)
        self.front_port = 0  # plain gRPC for the HTTP front beside the router (create_server)
        self.grpc_server = grpc_server
        self.lease = lease
        self.prefetch: PrefetchPlanner | None = None  # set by create_server when it is on
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
        if self.rank_server is not None:
            self.rank_server.stop(0)
        self.grpc_server.stop(grace).wait(timeout=(grace or 0) + 5)
        self.runtime.stop()
        if self.prefetch is not None:
            self.prefetch.stop()
        if self._watch is not None:
            self._watch.stop()
        if self.lease is not None:
            self.lease.stop()
        self._channels.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()

    def health_details(self) -> dict[str, str]:
        """What /health adds to its status: where pins live and, while degraded, why."""
        store = self.runtime.store
        if not isinstance(store, FailoverStore):
            return {"redis": "none (in-process state)"}
        if store.degraded:
            return {"redis": "degraded", "redis_error": store.degraded_reason or "unknown"}
        return {"redis": "ok"}

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self.grpc_server.wait_for_termination(timeout)


def build_store(config: RouterConfig, metrics: RouterMetrics) -> AdmissionStore:
    """Redis with a local fallback when Redis is configured, else in-process only."""
    settings = config.redis_settings()
    if not settings.configured:
        return LocalStore()
    client = connect(settings, config.redis_timeout_seconds)
    remote = RedisStore(client, config.redis_prefix, config.router_id)
    return FailoverStore(
        remote,
        config.admission.pin_ttl_seconds,
        on_redis_error=lambda _error: metrics.redis_errors.inc(),
        on_degraded=lambda degraded: metrics.degraded.set(1 if degraded else 0),
    )


def _grpc_server(config: RouterConfig, name: str, interceptors, **options) -> PooledServer:
    return PooledServer(config.max_workers, name, interceptors=interceptors, **options)


def _bind(server: grpc.Server, address: str, config: RouterConfig) -> int:
    """Bind the client port, with TLS when certificate files are given; returns the port."""
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise ValueError("tls_cert_file and tls_key_file: give both or neither")
    if config.tls_cert_file and config.tls_key_file:
        key = Path(config.tls_key_file).read_bytes()
        chain = Path(config.tls_cert_file).read_bytes()
        port = server.add_secure_port(address, grpc.ssl_server_credentials([(key, chain)]))
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the router to {address}")
    return port


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
        config.redis_retry_seconds,
        generation_queue=generation_queue,
        resync_grace_seconds=config.resync_grace_seconds,
        pin_sweep_seconds=config.pin_sweep_seconds,
    )
    channels = EngineChannels()
    watch = StreamWatch(config.stream_idle_seconds, lambda: set(runtime.ranks())).start()
    runtime.removal_listeners.append(watch.rank_removed)
    interceptors = (FleetSecretInterceptor(config.fleet_secret),)
    grpc_server = _grpc_server(config, "router-grpc", interceptors)
    planner = None
    if config.prefetch:
        planner = PrefetchPlanner(channels.stub, clock, config.admission.max_wait_seconds)
        runtime.after_pass.append(planner.after_pass)
    servicer = RouterServicer(
        runtime,
        channels,
        config.limits,
        clock,
        watch,
        config.max_call_seconds,
        planner,
        config.migrate_kv,
    )
    router_pb2_grpc.add_RouterServicer_to_server(servicer, grpc_server)
    registry = RankRegistryServicer(
        runtime,
        config.admission.heartbeat_timeout_seconds,
        on_start=lambda info: channels.renew(info.address),
    )
    rank_server = None
    if config.rank_address is None:
        router_pb2_grpc.add_RankRegistryServicer_to_server(registry, grpc_server)
    else:
        # No message a rank sends needs the client port's 80 MiB (proto/limits.py).
        rank_limits = (
            ("grpc.max_receive_message_length", RANK_PORT_MESSAGE_BYTES),
            ("grpc.max_send_message_length", RANK_PORT_MESSAGE_BYTES),
        )
        rank_server = _grpc_server(config, "router-ranks", interceptors, options=rank_limits)
        router_pb2_grpc.add_RankRegistryServicer_to_server(registry, rank_server)
    health_servicer = health.HealthServicer()
    for target in (grpc_server, rank_server):
        if target is not None:
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, target)
    for name in ("", *SERVICE_NAMES):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    enable_reflection((*SERVICE_NAMES, health.SERVICE_NAME), grpc_server)
    port = _bind(grpc_server, address, config)
    # The HTTP front in the same pod speaks to the router in the clear, on loopback only when
    # the client port serves TLS (the certificate need not name an address the pod can dial).
    front_port = port
    if config.tls_cert_file:
        front_port = grpc_server.add_insecure_port("127.0.0.1:0")
    rank_port = None
    if rank_server is not None:
        rank_port = rank_server.add_insecure_port(config.rank_address)
        if rank_port == 0:
            raise OSError(f"could not bind the rank port to {config.rank_address}")
        rank_server.start()
    lease = None
    if isinstance(store, FailoverStore):
        lease = ReplicaLease(store, config.lease_seconds).start()
    runtime.start()
    if planner is not None:
        planner.start()
    grpc_server.start()
    server = RouterServer(
        grpc_server, runtime, channels, metrics, health_servicer, lease, watch, rank_server
    )
    server.prefetch = planner
    server.rank_port = rank_port
    server.front_port = front_port
    if config.metrics_port is not None:
        # On the client port's address (--host), never wider: a router bound to loopback must
        # not publish its metrics on every interface.
        server.serve_metrics(config.metrics_port, address.rsplit(":", 1)[0].strip("[]"))
    log.info(
        "router %s on port %d (affinity %s, placement %s, store %s)",
        config.router_id,
        port,
        config.admission.affinity,
        config.admission.placement,
        type(store).__name__,
    )
    return server, port
