"""`kvfleet engine`: one engine rank (the operator's pod command line)."""

from __future__ import annotations

import argparse
import logging
import os
import threading

from ..api.tool_calls import add_tool_call_parser_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "engine",
        help="run one engine rank (gRPC Engine, OpenAI HTTP, /metrics)",
        description="Run one engine rank: the gRPC Engine service, the OpenAI HTTP API and "
        "/metrics; with --router it registers and heartbeats. Flags left out keep the "
        "--config file's values (else the engine's defaults).",
    )
    parser.add_argument(
        "--role",
        choices=("both", "context", "generation"),
        default=None,
        help="disaggregation role (default: both)",
    )
    parser.add_argument("--host", default="0.0.0.0", help="bind address")
    parser.add_argument(
        "--advertise-host",
        default=os.environ.get("POD_IP"),
        help="host the router dials (default: $POD_IP, else this host's address)",
    )
    parser.add_argument("--grpc-port", type=int, default=50061, help="gRPC Engine; 0: free")
    parser.add_argument("--http-port", type=int, default=8000, help="-1: no HTTP API")
    parser.add_argument("--metrics-port", type=int, default=9401, help="-1: no /metrics")
    parser.add_argument(
        "--router",
        default=None,
        help="HOST:PORT of the router's rank port (comma-separated: replicas, tried in turn)",
    )
    parser.add_argument("--rank-id", default=None, help="default: the host name")
    parser.add_argument(
        "--fleet-secret-file",
        default=None,
        help="the fleet secret the router's rank port asks for (default: $KVFLEET_FLEET_SECRET)",
    )
    parser.add_argument(
        "--podinfo-dir",
        default="/etc/podinfo",
        help="downward API volume with the pod's annotations (kvfleet.dev/draining)",
    )
    parser.add_argument("--config", default=None, help="engine.yaml (the operator's layout)")
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=30.0,
        help="on SIGTERM, let running requests finish for up to this long before stopping",
    )
    parser.add_argument(
        "--drain-linger-seconds",
        type=float,
        default=0.0,
        help="on SIGTERM, once running requests finished, serve KV pulls of conversations "
        "moved off this rank for this long more (within --drain-seconds)",
    )
    parser.add_argument("--disk-tier-dir", default=None, help="the shared disk KV tier's folder")
    parser.add_argument("--host-kv-gib", type=float, default=None, help="host KV tier size")
    parser.add_argument(
        "--disk-kv-gib", type=float, default=None, help="this rank's share of the disk tier"
    )
    parser.add_argument(
        "--disk-prefetch-num-reqs",
        type=int,
        default=None,
        help="queued requests whose disk blocks are onboarded to host before admission",
    )
    parser.add_argument("--model", default=None, help="preset name (tiny, 1b, 8b)")
    parser.add_argument("--model-path", default=None, help="local checkpoint directory")
    add_tool_call_parser_flag(parser)
    parser.add_argument("--max-batch-size", type=int, default=None, help="slots (sequences)")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="step token budget"
    )
    parser.add_argument("--kv-pages", type=int, default=None, help="pages per KV pool")
    parser.add_argument(
        "--device", default=None, help="auto (default: CUDA when present, else CPU), cpu, cuda[:N]"
    )
    parser.add_argument(
        "--gpu-memory-fraction",
        type=float,
        default=None,
        help="CUDA: the share of the GPU's memory for weights, activations and KV (default 0.9)",
    )
    parser.add_argument(
        "--cpu-kv-gib", type=float, default=None, help="CPU: the device KV's cap (default 4)"
    )
    parser.add_argument(
        "--dtype", default=None, help="weights: auto (the checkpoint's), float32, bfloat16, float16"
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default=None,
        choices=("auto", "bf16", "fp8_e4m3"),
        help="KV pages: auto (the weights' dtype), bf16, fp8_e4m3 (twice the pages per byte)",
    )
    parser.add_argument(
        "--compute-backend", default=None, help="torch (the model) or sim (cost model, no tensors)"
    )
    parser.add_argument(
        "--sim-time-scale", type=float, default=None, help="sim: factor on each step's sleep"
    )
    parser.add_argument("--sim-costs", default=None, help="sim: a sim_costs.yaml (hardware)")
    parser.add_argument(
        "--step-log", default=None, help="append one JSON line per engine step to this file"
    )
    parser.add_argument(
        "--tensor-parallel",
        type=int,
        default=None,
        help="workers (GPUs) of this rank; start it under torchrun --nproc-per-node N: "
        "worker 0 serves, the others follow its steps",
    )
    parser.set_defaults(func=run)  # fmt: skip


def engine_config_from_args(args: argparse.Namespace):
    """The config file (if any) with the command line's explicit values on top."""
    from ..config.engine_config import EngineConfig
    from ..config.engine_yaml import load_engine_config

    config = load_engine_config(args.config) if args.config else EngineConfig()
    return config.with_changes(
        role=args.role,
        model=args.model,
        model_path=args.model_path,
        max_batch_size=args.max_batch_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_pages=args.kv_pages,
        device=args.device,
        dtype=getattr(args, "dtype", None),
        kv_cache_dtype=getattr(args, "kv_cache_dtype", None),
        gpu_memory_fraction=getattr(args, "gpu_memory_fraction", None),
        cpu_kv_gib=getattr(args, "cpu_kv_gib", None),
        # getattr: namespaces built without the sim flags (older callers) keep the file's values
        compute_backend=getattr(args, "compute_backend", None),
        sim_time_scale=getattr(args, "sim_time_scale", None),
        sim_costs_path=getattr(args, "sim_costs", None),
        step_log_path=getattr(args, "step_log", None),
        disk_tier_dir=args.disk_tier_dir,
        host_kv_gib=args.host_kv_gib,
        disk_kv_gib=args.disk_kv_gib,
        disk_prefetch_num_reqs=args.disk_prefetch_num_reqs,
        tensor_parallel=getattr(args, "tensor_parallel", None),
    )


def run(args: argparse.Namespace) -> int:
    from ...core.stop_signals import stop_on_signals
    from ...router.fleet_secret import SECRET_ENV, load_fleet_secret
    from ..config.model_config import PRESETS
    from ..core.gc_heap import freeze_startup_heap
    from .engine_rank import EngineRank, RankAddresses
    from .pod_ranks import pod_ranks

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = engine_config_from_args(args)
    if not config.model_path and config.model not in PRESETS:
        raise SystemExit(f"--model: unknown model {config.model!r}; known: {sorted(PRESETS)}")
    secret = load_fleet_secret(args.fleet_secret_file)
    if secret:
        # The disk tier (and the disk hand-off) derive their block-file key from it
        # (kvstore/tiers/disk_key.py); so do the ranks a pod runs as processes of its own.
        os.environ[SECRET_ENV] = secret
    if config.tensor_parallel > 1:
        if config.ranks_per_pod != 1:
            raise SystemExit(
                "--tensor-parallel: a tensor-parallel pod runs one rank (ranks_per_pod 1)"
            )
        if int(os.environ.get("RANK", "0")) > 0:  # torchrun's worker index: a follower
            from ..compute.rank_group import follow, leave_rank_group

            follow(config)
            leave_rank_group()
            return 0
    addresses = RankAddresses(
        host=args.host,
        grpc_port=args.grpc_port,
        http_port=None if args.http_port < 0 else args.http_port,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        router=args.router,
        rank_id=args.rank_id or os.uname().nodename,
        advertise_host=args.advertise_host,
        fleet_secret=secret,
    )
    stop = stop_on_signals()  # before the ranks serve: a SIGTERM then drains them
    ranks = []
    for rank_config, rank_addresses in pod_ranks(config, addresses):
        rank = EngineRank(
            rank_config,
            rank_addresses,
            podinfo_dir=args.podinfo_dir,
            tool_call_parser=args.tool_call_parser,
        ).start()
        ranks.append(rank)
        ports = f"grpc {rank.grpc_port}, http {rank.http_port}, metrics {rank.metrics_port}"
        print(
            f"engine {rank_addresses.rank_id} ({config.role}, model {config.model}): {ports}",
            flush=True,
        )
    # The model, the engines and their servers are up: their objects are never garbage.
    frozen = freeze_startup_heap()
    print(f"startup heap kept out of the GC's full passes: {frozen} objects", flush=True)
    stop.wait()
    # SIGTERM (a pod deletion, an eviction, a roll): drain within the pod's grace period, the
    # ranks side by side so the budget is not spent once per rank.
    leaving = [
        threading.Thread(
            target=rank.drain_and_stop,
            args=(args.drain_seconds,),
            kwargs={"linger_seconds": args.drain_linger_seconds},
        )
        for rank in ranks
    ]
    for thread in leaving:
        thread.start()
    for thread in leaving:
        thread.join()
    for rank in ranks:
        stop_workers = getattr(rank.core.compute, "stop_workers", None)
        if stop_workers is not None:
            stop_workers()  # a tensor-parallel rank's followers exit too
    if config.tensor_parallel > 1:
        from ..compute.rank_group import leave_rank_group

        leave_rank_group()
    return 0
