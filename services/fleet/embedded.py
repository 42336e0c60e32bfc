"""An embedded fleet in one process: a router, N engine ranks and the OpenAI HTTP front.

The HTTP front calls the router's gRPC Generate, so conversation affinity applies to OpenAI
clients too. Pins live in Redis under a fresh key prefix when one answers, else in-process.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from dataclasses import dataclass, field

from ..engine.api.http_backends import model_card
from ..engine.api.tool_calls import resolve_tool_family
from ..engine.config.engine_config import EngineConfig
from ..engine.rank.engine_rank import EngineRank, RankAddresses
from ..router.admission import AdmissionConfig
from .metrics import FleetMetrics, serve_fleet_metrics
from .router_front import RouterFront

log = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class FleetConfig:
    """What `kvfleet up` starts."""

    engine: EngineConfig = field(default_factory=lambda: EngineConfig(max_batch_size=4))
    num_ranks: int = 2
    host: str = "127.0.0.1"
    router_port: int = 0
    http_port: int = 0
    redis_url: str | None = DEFAULT_REDIS_URL  # None: never try Redis
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)  # affinity, wait bound
    metrics_port: int | None = None  # one /metrics page for router and ranks; None: none
    tool_call_parser: str = "auto"  # --tool-call-parser (tool_calls.resolve_tool_family)
    migrate_kv: bool = False  # RouterConfig.migrate_kv: moved turns pull their home's KV


def redis_answers(url: str, timeout: float = 0.5) -> bool:
    """True if a Redis server answers PING at `url`."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class EmbeddedFleet:
    """Router + ranks + HTTP front, started and stopped together."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.redis_url = (
            config.redis_url if config.redis_url and redis_answers(config.redis_url) else None
        )
        self.redis_prefix = f"kvfleet-up-{uuid.uuid4().hex[:10]}"
        self.ranks: list[EngineRank] = []
        self.router = None
        self.router_port: int | None = None
        self.http: RouterFront | None = None
        self._metrics_http = None
        self.metrics_port: int | None = None

    @property
    def router_address(self) -> str:
        return f"{self.config.host}:{self.router_port}"

    @property
    def http_base_url(self) -> str:
        return f"http://{self.config.host}:{self.http.port if self.http else 0}/v1"

    def start(self, timeout: float = 30.0) -> EmbeddedFleet:
        """Start everything; return once every rank is registered with the router."""
        from ..router.server import RouterConfig, create_server

        c = self.config
        # The ranks register on the client port: a secret of this fleet's own keeps anyone who
        # reaches that port from registering a rank of theirs (and receiving traffic).
        secret = secrets.token_urlsafe(32)
        router_config = RouterConfig(
            admission=c.admission,
            redis_url=self.redis_url,
            redis_prefix=self.redis_prefix,
            fleet_secret=secret,
            migrate_kv=c.migrate_kv,
        )
        self.router, self.router_port = create_server(f"{c.host}:{c.router_port}", router_config)
        for index in range(c.num_ranks):
            addresses = RankAddresses(
                host=c.host,
                router=self.router_address,
                rank_id=f"rank-{index}",
                fleet_secret=secret,
            )
            self.ranks.append(EngineRank(c.engine, addresses).start())
        first = self.ranks[0]  # every rank runs the same model
        card = model_card(first.core.model_config)
        template = getattr(first.tokenizer, "chat_template", None)
        family = resolve_tool_family(c.tool_call_parser, template, c.engine.model_path)
        self.http = RouterFront(
            self.router_address, first.tokenizer, first.model_names, card, c.host, c.http_port,
            tool_family=family, max_request_tokens=first.core.max_request_tokens(),
        ).start()  # fmt: skip
        if c.metrics_port is not None:
            ranks = {rank.addresses.rank_id: rank.metrics.registry for rank in self.ranks}
            collector = FleetMetrics(self.router.metrics.registry, ranks)
            self._metrics_http = serve_fleet_metrics(collector, c.host, c.metrics_port)
            self.metrics_port = self._metrics_http.server_port
        deadline = time.monotonic() + timeout
        for rank in self.ranks:
            if not rank.link.registered.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"rank {rank.addresses.rank_id} did not register in {timeout} s")
        return self

    def stop(self) -> None:
        """Stop /metrics, the HTTP front, the ranks, the router; delete this fleet's Redis keys."""
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
        if self.http is not None:
            self.http.stop()
        for rank in self.ranks:
            rank.stop(grace=1.0)
        if self.router is not None:
            self.router.stop(grace=1.0)
        if self.redis_url:
            self._delete_redis_keys()

    def _delete_redis_keys(self) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_timeout=1.0)
        try:
            keys = list(client.scan_iter(match=f"{self.redis_prefix}*", count=500))
            if keys:
                client.delete(*keys)
        except redis.RedisError as error:
            log.warning("could not delete Redis keys %s*: %s", self.redis_prefix, error)
        finally:
            client.close()
