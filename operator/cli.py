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
    parser.add_argument(
        "--release-fleets",
        metavar="DEPLOYMENT",
        default=None,
        help="instead of running: scale the operator's Deployment DEPLOYMENT (in"
        " --operator-namespace) to 0, wait for its pods to go, then take the operator's"
        " finalizer off every KVFleet (of --namespace, default all), so fleets and namespaces"
        " can be deleted once it is uninstalled (the chart's pre-delete hook)",
    )
    parser.add_argument(
        "--operator-namespace",
        default=None,
        help="with --release-fleets: the namespace of the operator's Deployment",
    )
    parser.set_defaults(func=run_operator)


def run_operator(args: argparse.Namespace) -> int:
    """Run the handlers until SIGTERM/SIGINT; kopf handles the signals and the drain of handlers."""
    if args.release_fleets:
        return release(args)
    import kopf
    import kvfleet.operator.handlers  # noqa: F401  (registers the handlers)

    from .peering import Peering, own_identity, peering_settings

    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    # Distinct priorities make peering an election: the highest runs the handlers, the others
    # pause until its keep-alive expires (kopf pauses every replica of an equal priority).
    priority = args.priority if args.priority is not None else secrets.randbelow(2**31)
    identity = own_identity()
    memo = kopf.Memo()
    if args.peering is not None:  # the start-up gate (peering.py) announces this replica first
        memo.peering = Peering(args.peering, identity, priority, tuple(args.namespace))
    kopf.configure(verbose=False)
    kopf.run(
        settings=peering_settings(),
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=priority,
        identity=identity,
        memo=memo,
        liveness_endpoint=liveness,
    )
    return 0


RELEASE_TIMEOUT_SECONDS = 120.0


def release(args: argparse.Namespace) -> int:
    """--release-fleets: stop the operator, then free every fleet of its finalizer."""
    import kubernetes

    from .release import release_fleets, stop_operator

    if not args.operator_namespace:
        print("kvfleet operator: --release-fleets needs --operator-namespace")
        return 2
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    client = kubernetes.client.ApiClient(configuration)
    stop_operator(client, args.operator_namespace, args.release_fleets, RELEASE_TIMEOUT_SECONDS)
    for fleet in release_fleets(client, args.namespace):
        print(f"kvfleet operator: released {fleet}")
    return 0
