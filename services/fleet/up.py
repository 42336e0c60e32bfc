"""`kvfleet up`: a router and engine ranks in one process, with one OpenAI front and /metrics:
the tiny preset on CPU by default, or a local Hugging Face checkpoint with `--model-path DIR`
(its tokenizer and chat template too).

Prints where to send requests; Ctrl-C (SIGINT/SIGTERM) stops everything. `--smoke` sends a
two-turn conversation through the router's gRPC API and through the OpenAI HTTP API, prints
the answers and the cached prompt tokens, and exits (0 when the second turns reused KV).

`--compute-backend sim` runs the ranks without tensors (step times from the cost model), so
`--model 8b` takes real agent prompts (a 128k context) on a CPU machine.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from ..engine.api.tool_calls import add_tool_call_parser_flag

# Step token budget when --max-num-batched-tokens is not given: the model forward on CPU is
# slow per token, the cost model is not (it prices chunks of the simulator's default size).
DEFAULT_STEP_TOKENS = {"torch": 256, "sim": 8192}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "up",
        help="run a router and engine ranks in one process (tiny model on CPU by default)",
        description="Run a router, engine ranks and an OpenAI-compatible HTTP front in one "
        "process; print their addresses. Pins go to Redis when one answers, else in-process.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address every server binds")
    parser.add_argument("--router-port", type=int, default=50051, help="router gRPC; 0: free")
    parser.add_argument("--http-port", type=int, default=8000, help="OpenAI HTTP; 0: free")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9400,
        help="/metrics of the router and every rank (label `rank`); 0: free, -1: none",
    )
    parser.add_argument("--ranks", type=int, default=2, help="engine ranks")
    parser.add_argument("--model", default="tiny", help="model preset: tiny, 1b, 8b")
    parser.add_argument(
        "--model-path",
        default="",
        help="a local Hugging Face model directory (config.json, safetensors, tokenizer); "
        "`kvfleet model-dir --arch ARCH DIR` writes a tiny one",
    )
    add_tool_call_parser_flag(parser)
    parser.add_argument(
        "--compute-backend",
        choices=("torch", "sim"),
        default="torch",
        help="torch: the model's forward; sim: cost-model step times, no tensors",
    )
    parser.add_argument(
        "--sim-time-scale", type=float, default=1.0, help="sim: factor on each step's sleep"
    )
    parser.add_argument("--max-batch-size", type=int, default=4, help="slots per rank")
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="step token budget (default: 256 with torch, 8192 with sim)",
    )
    parser.add_argument(
        "--affinity",
        choices=("strict", "lenient"),
        default="strict",
        help="strict: a pinned turn waits (bounded) for its rank; lenient: any free rank",
    )
    parser.add_argument(
        "--placement",
        choices=("load", "prefix"),
        default="load",
        help="how new conversations are placed",
    )
    parser.add_argument(
        "--migrate-kv",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="a turn placed away from its live home pulls the conversation's KV from it "
        "instead of recomputing (docs/prefetch.md)",
    )
    parser.add_argument(
        "--disk-tier-dir",
        default="",
        help="a shared disk tier folder for every rank (sim ranks keep marker files there); "
        "a draining rank's retained turns reach the others through it",
    )
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/0",
        help="used when it answers; else pins stay in-process",
    )
    parser.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, ...")
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=("auto", "bf16", "fp8_e4m3"),
        help="KV pages: auto (the weights' dtype), bf16, fp8_e4m3 (twice the pages per byte)",
    )
    parser.add_argument(
        "--smoke",
        "--once",
        action="store_true",
        dest="smoke",
        help="send a two-turn conversation through both APIs, then exit",
    )
    parser.set_defaults(func=run)


def fleet_config(args: argparse.Namespace):
    """The `FleetConfig` the command line asks for."""
    from ..engine.config.engine_config import EngineConfig
    from ..router.admission import AdmissionConfig
    from .embedded import FleetConfig

    step_tokens = args.max_num_batched_tokens or DEFAULT_STEP_TOKENS[args.compute_backend]
    # A checkpoint is served under its directory's name (and "kvfleet").
    model = Path(args.model_path).name if args.model_path else args.model
    engine = EngineConfig(
        model=model,
        model_path=args.model_path,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        compute_backend=args.compute_backend,
        sim_time_scale=args.sim_time_scale,
        max_batch_size=args.max_batch_size,
        max_num_batched_tokens=step_tokens,
        disk_tier_dir=args.disk_tier_dir,
    )
    return FleetConfig(
        engine,
        args.ranks,
        args.host,
        args.router_port,
        args.http_port,
        args.redis_url,
        AdmissionConfig(affinity=args.affinity, placement=args.placement),
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        tool_call_parser=args.tool_call_parser,
        migrate_kv=args.migrate_kv,
    )


def run(args: argparse.Namespace) -> NoReturn:
    """`serve`, then leave without the interpreter's teardown: the fleet has stopped and its
    threads are joined by then, and the teardown would only print the leak report of compiled
    libraries torch imports on the way (triton's nanobind types, ~100 lines on stderr after
    "stopped.")."""
    code = serve(args)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(args: argparse.Namespace) -> int:
    """Start the fleet, print where it listens, run until a signal (or the smoke check)."""
    from ..core.stop_signals import stop_on_signals
    from ..engine.config.model_config import PRESETS
    from ..engine.core.gc_heap import freeze_startup_heap
    from ..router.redis_connect import redacted
    from .embedded import EmbeddedFleet

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if not args.model_path and args.model not in PRESETS:
        print(f"kvfleet up: --model {args.model!r} unknown; known: {sorted(PRESETS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.ranks < 1:
        print(f"kvfleet up: --ranks {args.ranks} must be >= 1", file=sys.stderr)
        return 2
    fleet = EmbeddedFleet(fleet_config(args))
    if fleet.redis_url:
        where = redacted(fleet.redis_url)
        print(f"pins: Redis at {where} (key prefix {fleet.redis_prefix})", flush=True)
    else:
        print(f"WARNING: no Redis answers at {redacted(args.redis_url)}: pins are kept IN-PROCESS "
              "(one router only)", flush=True)  # fmt: skip
    stop = stop_on_signals()
    try:
        try:
            fleet.start()
        except (OSError, RuntimeError) as error:  # grpc raises RuntimeError when it cannot bind
            print(f"kvfleet up: {error}; choose other ports with --router-port / --http-port / "
                  "--metrics-port (0 picks free ones)", file=sys.stderr, flush=True)  # fmt: skip
            return 2
        print(f"router: grpc://{fleet.router_address}", flush=True)
        print(f"OpenAI base URL: {fleet.http_base_url}", flush=True)
        if fleet.metrics_port is not None:
            print(f"metrics: http://{args.host}:{fleet.metrics_port}/metrics", flush=True)
        model = Path(args.model_path).name if args.model_path else args.model
        print(f"ranks: {', '.join(r.addresses.rank_id for r in fleet.ranks)} (model {model}, "
              f"{args.compute_backend}, {args.max_batch_size} slots each, "
              f"{args.affinity} affinity)", flush=True)  # fmt: skip
        freeze_startup_heap()  # the fleet is up: its startup objects are never garbage
        if args.smoke:
            from .smoke import run_smoke

            return 0 if run_smoke(fleet.router_address, fleet.http_base_url) else 1
        print("Ctrl-C stops everything.", flush=True)
        stop.wait()
        return 0
    finally:
        fleet.stop()
        print("stopped.", flush=True)
