"""`kvfleet router`: run the router (the operator renders these flags into the router pods)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any


def default_replica_id() -> str | None:
    """The pod's name when known: a restarted pod clears what its last run reserved."""
    if os.environ.get("POD_NAME"):
        return os.environ["POD_NAME"]
    if os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("HOSTNAME"):
        return os.environ["HOSTNAME"]
    return None


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `router` subcommand (the fleet layer adds the HTTP front: `run`'s `front`)."""
    parser = subparsers.add_parser(
        "router",
        help="run the router (gRPC, Redis pins, metrics)",
        description="Run the router: the gRPC Router service, the RankRegistry on its own "
        "rank port (fleet secret required), conversation pins and slot reservations in Redis "
        "(in-process without --redis-url), /metrics.",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to bind")
    parser.add_argument("--grpc-port", type=int, default=50051, help="gRPC port; 0: a free one")
    parser.add_argument("--metrics-port", type=int, default=9400, help="/metrics port; -1: none")
    parser.add_argument(
        "--rank-port",
        type=int,
        default=50052,
        help="rank-facing RankRegistry (Register, Heartbeat, KV events); 0 picks a free port",
    )
    parser.add_argument(
        "--fleet-secret-file",
        default=None,
        help="the secret ranks must show on the rank port (default: $KVFLEET_FLEET_SECRET)",
    )
    parser.add_argument(
        "--insecure-rank-port",
        action="store_true",
        help="serve the rank port without a fleet secret (local experiments only)",
    )
    parser.add_argument("--tls-cert-file", default=None, help="PEM chain: TLS on the gRPC port")
    parser.add_argument("--tls-key-file", default=None, help="PEM key of --tls-cert-file")
    parser.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="OpenAI API and GET /health over this router; 0: a free one; -1: none",
    )
    parser.add_argument("--model", default="tiny", help="the model name the OpenAI API serves")
    parser.add_argument(
        "--model-path", default=None, help="checkpoint dir whose tokenizer the OpenAI API uses"
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        help="redis://HOST:6379/0 (default: $KVFLEET_REDIS_URL, which keeps a password in it off "
        "the command line, where every process of the node can read it); without either all "
        "state is in-process",
    )
    parser.add_argument("--redis-prefix", default="kvfleet", help="key prefix (one per fleet)")
    parser.add_argument(
        "--redis-password-file",
        default=None,
        help="Redis AUTH password when the URL has none (default: $KVFLEET_REDIS_PASSWORD)",
    )
    parser.add_argument("--redis-ca-file", default=None, help="CA bundle for rediss://")
    parser.add_argument(
        "--redis-sentinel",
        default=None,
        help="host:port,host:port of Redis Sentinels (instead of --redis-url)",
    )
    parser.add_argument("--redis-sentinel-master", default=None, help="the Sentinels' master name")
    parser.add_argument("--redis-tls", action="store_true", help="Sentinel: TLS to the master")
    parser.add_argument(
        "--replica-id",
        "--router-id",
        dest="replica_id",
        default=default_replica_id(),
        help="names this replica's reservations; stable across restarts "
        "(default: $POD_NAME, $HOSTNAME in Kubernetes, else random)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=float,
        default=10.0,
        help="a killed replica's reservations are released within about 1.3 x this",
    )
    parser.add_argument(
        "--affinity",
        choices=("strict", "lenient", "none"),
        default="strict",
        help="strict: a pinned turn waits (bounded) for its rank; lenient: any free rank; "
        "none: pins ignored (every turn placed as new)",
    )
    parser.add_argument(
        "--max-wait-passes",
        type=int,
        default=1_000_000,
        help="deferrals before a pinned request is placed elsewhere",
    )
    parser.add_argument(
        "--max-wait-seconds",
        type=float,
        default=30.0,
        help="the same bound in time (the one that binds by default)",
    )
    parser.add_argument(
        "--prefetch",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="ask a conversation's home rank to bring its KV up before its next turn "
        "(timed by the conversation's own gaps) and while the turn waits for a slot there",
    )
    parser.add_argument(
        "--migrate-kv",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="a turn placed away from its live home (wait bound, lenient away) has its new "
        "rank pull the conversation's KV from the home instead of recomputing it",
    )
    parser.add_argument(
        "--placement",
        choices=("load", "prefix", "round_robin"),
        default="load",
        help="how new conversations are placed (round_robin: ranks in turn, a baseline)",
    )
    parser.add_argument(
        "--rehome-below",
        type=float,
        default=0.0,
        help="a pinned turn whose home holds some but less than this share of its prompt (by "
        "the ranks' KV events) is placed as a new conversation and pinned where it lands; "
        "0: never (docs/router.md)",
    )
    parser.add_argument(
        "--pin-ttl-seconds", type=float, default=3600.0, help="a conversation's pin lifetime"
    )
    parser.add_argument(
        "--heartbeat-timeout-seconds",
        type=float,
        default=10.0,
        help="a rank silent this long is removed",
    )
    parser.add_argument(
        "--redis-timeout-seconds",
        type=float,
        default=1.0,
        help="socket timeout of each Redis call (past it the router serves from local state)",
    )
    parser.add_argument(
        "--max-queue-seconds",
        type=float,
        default=600.0,
        help="a request waiting longer fails with RESOURCE_EXHAUSTED",
    )
    parser.add_argument(
        "--max-call-seconds",
        type=float,
        default=None,
        help="cap on one forwarded engine call (default: the client's deadline, or none)",
    )
    parser.add_argument(
        "--stream-idle-seconds",
        type=float,
        default=120.0,
        help="an engine stream silent this long is cancelled and the rank taken for failed",
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=25.0,
        help="on SIGTERM, time for streams to finish (below the pod's grace)",
    )
    parser.set_defaults(func=run)
    return parser


def router_config(args: argparse.Namespace):
    """The `RouterConfig` the command line asks for."""
    from .admission import AdmissionConfig
    from .fleet_secret import load_fleet_secret
    from .redis_connect import URL_ENV, load_password
    from .server import RouterConfig

    secret = load_fleet_secret(args.fleet_secret_file)
    admission = AdmissionConfig(
        affinity=args.affinity,
        placement=args.placement,
        max_wait_passes=args.max_wait_passes,
        max_wait_seconds=args.max_wait_seconds,
        rehome_below=args.rehome_below,
        pin_ttl_seconds=args.pin_ttl_seconds,
        heartbeat_timeout_seconds=args.heartbeat_timeout_seconds,
    )
    extra = {"router_id": args.replica_id} if args.replica_id else {}
    return RouterConfig(
        admission=admission,
        redis_url=args.redis_url or os.environ.get(URL_ENV) or None,
        redis_prefix=args.redis_prefix,
        redis_password=load_password(args.redis_password_file),
        redis_ca_file=args.redis_ca_file,
        redis_sentinels=tuple(a for a in (args.redis_sentinel or "").split(",") if a),
        redis_sentinel_master=args.redis_sentinel_master,
        redis_tls=args.redis_tls,
        max_queue_seconds=args.max_queue_seconds,
        max_call_seconds=args.max_call_seconds,
        prefetch=args.prefetch,
        migrate_kv=args.migrate_kv,
        lease_seconds=args.lease_seconds,
        redis_timeout_seconds=args.redis_timeout_seconds,
        stream_idle_seconds=args.stream_idle_seconds,
        rank_address=f"{args.host}:{args.rank_port}",
        fleet_secret=secret,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        **extra,
    )


# Starts the OpenAI HTTP front for (args, router gRPC port); returns something to `stop()`.
# (args, the plain gRPC port to call, what /health adds) -> the running front
FrontStarter = Callable[[argparse.Namespace, int, Callable[[], dict]], Any]


def run(args: argparse.Namespace, front: FrontStarter | None = None) -> int:
    """Start the router (and, with `front` and --http-port >= 0, its HTTP front) and serve
    until SIGTERM/SIGINT; 2 when a port cannot be bound."""
    import logging
    import sys

    from ..core.stop_signals import stop_on_signals
    from .fleet_secret import SECRET_ENV
    from .server import create_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = router_config(args)
    if config.fleet_secret is None and not args.insecure_rank_port:
        print(f"kvfleet router: the rank port needs a fleet secret: --fleet-secret-file or "
              f"${SECRET_ENV} (or --insecure-rank-port)", file=sys.stderr, flush=True)  # fmt: skip
        return 2
    stop = stop_on_signals()  # before anything serves
    try:
        server, port = create_server(f"{args.host}:{args.grpc_port}", config)
    except (OSError, RuntimeError) as error:  # grpc raises RuntimeError when it cannot bind
        ports = (
            f"--grpc-port {args.grpc_port}, --rank-port {args.rank_port} "
            f"or --metrics-port {args.metrics_port}"
        )
        print(f"kvfleet router: could not listen on {args.host} ({ports}): {error}; choose "
              "free ports (0 picks one)", file=sys.stderr, flush=True)  # fmt: skip
        return 2
    print(
        f"router listening on port {port} rank port {server.rank_port} "
        f"metrics port {server.metrics_port}",
        flush=True,
    )
    http = None
    if front is not None and args.http_port >= 0:
        try:
            http = front(args, server.front_port, server.health_details)
        except OSError as error:  # FileNotFoundError included: no tokenizer.json
            print(f"kvfleet router: {error}; --http-port 0 picks a free port, -1 serves no HTTP",
                  file=sys.stderr, flush=True)  # fmt: skip
            server.stop(0)
            return 2
        print(f"router OpenAI API on http port {http.port}", flush=True)
    stop.wait()
    server.stop(args.grace_seconds)  # /health turns 503 at once; streams get the grace
    if http is not None:
        http.stop()
    return 0
