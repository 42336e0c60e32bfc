"""`kvfleet router`: run the router (the operator renders these flags into the router pods)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `router` subcommand."""
    parser = subparsers.add_parser("router", help="run the router (gRPC, Redis pins, metrics)")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind")
    parser.add_argument("--grpc-port", type=int, default=50051, help="0 picks a free port")
    parser.add_argument("--metrics-port", type=int, default=9400, help="-1: no /metrics")
    parser.add_argument(
        "--redis-url", default=None, help="redis://HOST:6379/0; without it all state is in-process"
    )
    parser.add_argument("--redis-prefix", default="kvfleet", help="key prefix (one per fleet)")
    parser.add_argument("--router-id", default=None, help="names this replica's reservations")
    parser.add_argument("--affinity", choices=("strict", "lenient"), default="strict")
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
        "--placement",
        choices=("load", "prefix"),
        default="load",
        help="how new conversations are placed",
    )
    parser.add_argument("--pin-ttl-seconds", type=float, default=3600.0)
    parser.add_argument("--heartbeat-timeout-seconds", type=float, default=10.0)
    parser.add_argument(
        "--max-queue-seconds",
        type=float,
        default=600.0,
        help="a request waiting longer fails with RESOURCE_EXHAUSTED",
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=25.0,
        help="on SIGTERM, time for streams to finish (below the pod's grace)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start the router and serve until SIGTERM/SIGINT."""
    import logging
    import signal
    import threading

    from kvfleet.services.router.admission import AdmissionConfig
    from kvfleet.services.router.server import RouterConfig, create_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    admission = AdmissionConfig(
        affinity=args.affinity,
        placement=args.placement,
        max_wait_passes=args.max_wait_passes,
        max_wait_seconds=args.max_wait_seconds,
        pin_ttl_seconds=args.pin_ttl_seconds,
        heartbeat_timeout_seconds=args.heartbeat_timeout_seconds,
    )
    extra = {"router_id": args.router_id} if args.router_id else {}
    config = RouterConfig(
        admission=admission,
        redis_url=args.redis_url,
        redis_prefix=args.redis_prefix,
        max_queue_seconds=args.max_queue_seconds,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        **extra,
    )
    server, port = create_server(f"{args.host}:{args.grpc_port}", config)
    print(f"router listening on port {port} metrics port {server.metrics_port}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(args.grace_seconds)
    return 0
