"""One engine rank: engine core, gRPC Engine service, OpenAI HTTP, /metrics, router link."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from dataclasses import dataclass

import grpc
from prometheus_client import start_http_server

from ...router.fleet_secret import load_fleet_secret
from ..api.http_backends import EngineBackend
from ..api.http_server import HttpServer
from ..api.openai_http import build_app
from ..api.tool_calls import resolve_tool_family
from ..config.engine_config import EngineConfig
from ..core.engine_core import EngineCore
from ..core.metrics import EngineMetrics
from ..model.tokenizer import tokenizer_for_model
from .grpc_service import create_engine_server
from .podinfo import PodInfo
from .router_link import RouterLink
from .worker_http import WorkerInfo, add_worker_routes

log = logging.getLogger(__name__)
# How long a leaving rank waits for a router to hear it before it refuses new calls anyway.
HEARD_WAIT_SECONDS = 10.0
# How long a leaving rank's last pulls (a moved conversation's KV) may run once it stops.
PULL_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class RankAddresses:
    """Where a rank listens (port 0: any free port; None: not served) and what it advertises."""

    host: str = "127.0.0.1"
    grpc_port: int = 0
    http_port: int | None = None
    metrics_port: int | None = None
    router: str | None = None
    rank_id: str = "rank-0"
    advertise_host: str | None = None
    # Shown to the router's rank port; None: $KVFLEET_FLEET_SECRET if set.
    fleet_secret: str | None = None


class EngineRank:
    """A running rank; `stop` ends everything it started, in reverse order."""

    def __init__(
        self,
        config: EngineConfig,
        addresses: RankAddresses,
        podinfo_dir: str | None = None,
        tool_call_parser: str = "auto",
    ) -> None:
        """`tool_call_parser`: what `--tool-call-parser` says (tool_calls.resolve_tool_family)."""
        self.config = config
        self.addresses = addresses
        # The downward API's view of this pod (None: not in Kubernetes, never draining).
        self.podinfo = PodInfo(podinfo_dir)
        self.tokenizer = tokenizer_for_model(config.model_path)
        self.tool_family = resolve_tool_family(
            tool_call_parser, getattr(self.tokenizer, "chat_template", None), config.model_path
        )
        self.metrics = EngineMetrics(config.model)
        self.link: RouterLink | None = None
        self.core = EngineCore(config, metrics=self.metrics, kv_event_sink=self._publish)
        self.model_names = (config.model, "kvfleet")
        self.grpc_server: grpc.Server | None = None
        self.grpc_port: int | None = None
        self.http: HttpServer | None = None
        self._metrics_http = None
        self.metrics_port: int | None = None
        self._terminating = False  # SIGTERM: report draining whatever the pod's mark says

    def start(self) -> EngineRank:
        """Start the core, the servers and (with a router address) registration."""
        a = self.addresses
        self.core.start()
        self.grpc_server, self._health, self.grpc_port, self.engine_servicer = create_engine_server(
            f"{a.host}:{a.grpc_port}", self.core, self.tokenizer
        )
        if a.http_port is not None:
            backend = EngineBackend(self.core, self.tokenizer, self.model_names)
            app = build_app(backend, tool_family=self.tool_family)
            app = add_worker_routes(app, backend, self._worker_info())
            self.http = HttpServer(app, a.host, a.http_port).start()
        if a.metrics_port is not None:
            self._metrics_http, _ = start_http_server(
                a.metrics_port, a.host, registry=self.metrics.registry
            )
            self.metrics_port = self._metrics_http.server_port
        if a.router:
            advertise = f"{a.advertise_host or _default_host(a.host)}:{self.grpc_port}"
            self.link = RouterLink(
                a.router,
                a.rank_id,
                advertise,
                self.config.max_batch_size,
                self.config.role,
                self.config.page_size,
                self.core.load,
                self.read_draining,
                a.fleet_secret or load_fleet_secret(),
                lambda: self._terminating,
            ).start()
        log.info("rank %s: grpc %s, http %s", a.rank_id, self.grpc_port, self.http_port)
        return self

    @property
    def http_port(self) -> int | None:
        return self.http.port if self.http else None

    def stop(self, grace: float = 2.0) -> None:
        """Refuse new calls, let streams end for `grace` s, stop heartbeats, stop the core.

        NOTE: heartbeats go on through the grace, so the router does not take the rank for
        silent and cancel the streams that are finishing."""
        if self.grpc_server is not None:
            self._health.enter_graceful_shutdown()
            self.grpc_server.stop(grace).wait(grace + 5)
        if self.link is not None:
            self.link.stop()
        if self.http is not None:
            self.http.stop()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
        self.core.stop()

    def drain_and_stop(
        self, drain_seconds: float, poll_seconds: float = 0.2, linger_seconds: float = 0.0
    ) -> None:
        """Leave gracefully (SIGTERM) within `drain_seconds`: report leaving (the router places
        nothing new here and moves pinned conversations at their next turn, naming this rank
        as their KV's home; their blocks reach the shared disk), and once a router heard it,
        refuse new generation work and let the requests in flight finish up to the deadline,
        serving pulls of moved conversations' KV all along, and for `linger_seconds` more
        (within the deadline: conversations whose next turn comes later still find their KV
        here), then stop.

        NOTE: an idle moment is no end of the drain while the router may still send turns here;
        after it heard, only calls it placed before can come, and those are refused (it retries
        them elsewhere) rather than cut at the deadline."""
        deadline = time.monotonic() + drain_seconds
        self._terminating = True
        self.read_draining()
        with contextlib.suppress(TimeoutError, RuntimeError):  # the flush runs before any stop
            self.core.call_on_core(lambda: None, max(0.0, deadline - time.monotonic()))
        if self.link is not None:
            self.link.beat_now()
            wait = min(HEARD_WAIT_SECONDS, max(0.0, deadline - time.monotonic()))
            heard = self.link.leaving_heard.wait(wait)
            log.info("rank %s leaving: %s", self.addresses.rank_id,
                     "the router heard" if heard else "no router heard it")  # fmt: skip
        if self.grpc_server is not None:  # new work is refused from here on, pulls served
            self._health.enter_graceful_shutdown()
            self.engine_servicer.leave()
        while time.monotonic() < deadline:  # what came in other ways (HTTP) finishes too
            load = self.core.load()
            streams = self.engine_servicer.streams.running if self.grpc_server else 0
            if load.running + load.queued + streams == 0:
                break
            time.sleep(poll_seconds)
        time.sleep(max(0.0, min(linger_seconds, deadline - time.monotonic())))
        # The finished turns' blocks are on the shared disk by now (DiskDrain, core thread);
        # a pull in progress gets a grace to end.
        self.stop(grace=min(PULL_GRACE_SECONDS, max(0.0, deadline - time.monotonic())))

    def read_draining(self) -> bool:
        """The pod's drain mark now (each heartbeat reads it); the core hears of every change
        and, on its own thread, flushes the retained prefixes to the shared disk tier."""
        draining = self._terminating or self.podinfo.draining()
        self.core.set_draining(draining)
        return draining

    def _worker_info(self) -> WorkerInfo:
        """What the peer-router endpoints (worker_http.py) report about this rank."""
        return WorkerInfo(
            model_name=self.config.model,
            model_path=self.config.model_path,
            page_size=self.config.page_size,
            max_model_len=self.core.model_config.max_position,
            max_batch_size=self.config.max_batch_size,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            kv_capacity_pages=sum(p.num_usable for p in self.core.manager.pools.values()),
            load=self.core.load,
        )

    def _publish(self, events) -> None:
        if self.link is not None:
            self.link.publish(events)


def _default_host(bind_host: str) -> str:
    """The address the router should dial: the bind host unless it is a wildcard."""
    if bind_host not in ("0.0.0.0", "::", ""):
        return bind_host
    return socket.gethostbyname(socket.gethostname())
