"""`kvfleet up`: a router and two engine ranks on CPU, in one process: the tiny preset, or a
local Hugging Face checkpoint with `--model-path DIR` (its tokenizer and chat template too).

Prints where to send requests; Ctrl-C (SIGINT/SIGTERM) stops everything. `--smoke` sends a
two-turn conversation through the router's gRPC API and through the OpenAI HTTP API, prints
the answers and the cached prompt tokens, and exits (0 when the second turns reused KV).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "up", help="run a router and two engine ranks (tiny model, CPU) in one process"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--router-port", type=int, default=50051, help="0 picks a free port")
    parser.add_argument("--http-port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--model", default="tiny", help="preset shape when no --model-path")
    parser.add_argument(
        "--model-path",
        default="",
        help="a local Hugging Face model directory (config.json, safetensors, tokenizer); "
        "`kvfleet model-dir --arch ARCH DIR` writes a tiny one",
    )
    parser.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, ...")
    parser.add_argument("--max-batch-size", type=int, default=4)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0",
                        help="used when it answers; else pins stay in-process")  # fmt: skip
    parser.add_argument(
        "--smoke",
        "--once",
        action="store_true",
        dest="smoke",
        help="send a two-turn conversation through both APIs, then exit",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvfleet.services.engine.engine_config import EngineConfig

    from .embedded import EmbeddedFleet, FleetConfig

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    # A checkpoint is served under its directory's name (and "kvfleet").
    model = Path(args.model_path).name if args.model_path else args.model
    engine = EngineConfig(model=model, model_path=args.model_path, dtype=args.dtype,
                          max_batch_size=args.max_batch_size)  # fmt: skip
    config = FleetConfig(engine, args.ranks, args.host, args.router_port, args.http_port,
                         args.redis_url)  # fmt: skip
    fleet = EmbeddedFleet(config)
    if fleet.redis_url:
        print(f"pins: Redis at {fleet.redis_url} (key prefix {fleet.redis_prefix})", flush=True)
    else:
        print(f"WARNING: no Redis answers at {args.redis_url}: pins are kept IN-PROCESS "
              "(one router only)", flush=True)  # fmt: skip
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        try:
            fleet.start()
        except (OSError, RuntimeError) as error:  # grpc raises RuntimeError when it cannot bind
            print(f"kvfleet up: {error}; choose other ports with --router-port / --http-port "
                  "(0 picks free ones)", file=sys.stderr, flush=True)  # fmt: skip
            return 2
        print(f"router: grpc://{fleet.router_address}", flush=True)
        print(f"OpenAI base URL: {fleet.http_base_url}", flush=True)
        print(f"ranks: {', '.join(r.addresses.rank_id for r in fleet.ranks)} "
              f"(model {model}, {args.max_batch_size} slots each)", flush=True)  # fmt: skip
        if args.smoke:
            from .smoke import run_smoke

            return 0 if run_smoke(fleet.router_address, fleet.http_base_url) else 1
        print("Ctrl-C stops everything.", flush=True)
        stop.wait()
        return 0
    finally:
        fleet.stop()
        print("stopped.", flush=True)
