"""`kvfleet operator`: run the KVFleet operator (kopf) in this process."""

from __future__ import annotations

import argparse
import secrets


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `operator` subcommand."""
    parser = subparsers.add_parser(
        "operator",
        help="run the KVFleet operator (kopf)",
        description="Run the kopf operator that turns KVFleet resources into a router, engine "
        "pools, volumes and a Redis, and scales the pools from the fleet's metrics.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument(
        "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    parser.add_argument(
        "--liveness-port", type=int, default=8080, help="serve /healthz on this port (0: off)"
    )
    parser.add_argument(
        "--peering",
        default=None,
        help="kopf peering object (KopfPeering/ClusterKopfPeering) for leader election among"
        " replicas; without it the operator runs standalone",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="with --peering: this replica's priority (default: random, so one replica leads)",
    )
    parser.set_defaults(func=run_operator)


def run_operator(args: argparse.Namespace) -> int:
    """Run the handlers until SIGTERM/SIGINT; kopf handles the signals and the drain of handlers."""
    import kopf
    import kvfleet.operator.handlers  # noqa: F401  (registers the handlers)

    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    # Distinct priorities make peering an election: the highest runs the handlers, the others
    # pause until its keep-alive expires (equal priorities would all run).
    priority = args.priority if args.priority is not None else secrets.randbelow(2**31)
    kopf.configure(verbose=False)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=priority,
        liveness_endpoint=liveness,
    )
    return 0
