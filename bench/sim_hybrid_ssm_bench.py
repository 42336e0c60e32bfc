"""Benchmark: pools sized for the retained turns' from-end state snapshots, on a hybrid model.

Replays Claude Code sessions through the simulator with the hybrid SSM preset
(bench/sim_hybrid_ssm.yaml: SSM layers with a snapshot 2048 tokens before each prompt's end,
beside window and full attention), `per_conversation` with max_num_turns 3 and a host tier, at
each concurrency (sessions replayed at once), with and without pool sizing that counts the
snapshots retained turns keep. The unsized arm is the baseline of its concurrency.

Run: .venv/bin/python bench/sim_hybrid_ssm_bench.py [--concurrency 32,64] [--gpu-pages 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_sizing import rank_kvstore
from rich.console import Console
from rich.table import Table
from sim_bench import STRICT, ratio, run_sim_arms

SSM_MODEL = Path(__file__).resolve().parent / "sim_hybrid_ssm.yaml"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="32,64", help="sessions replayed at once")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--gpu-pages", type=int, default=3000, help="per rank")
    parser.add_argument("--host-pages", type=int, default=6000, help="per rank")
    parser.add_argument("--chunk-tokens", type=int, default=8192, help="prefill chunk")
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--stagger", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", type=Path, default=SSM_MODEL, help="sim YAML")
    return parser.parse_args()


async def run_all(args: argparse.Namespace) -> list[tuple[int, list[tuple]]]:
    out = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        common = {
            **STRICT,
            "ranks": str(args.ranks),
            "slots": str(args.slots),
            "gpu_pages": str(args.gpu_pages),
            "host_pages": str(args.host_pages),
            "reuse_policy": "per_conversation",
            "max_num_turns": "3",
            "chunk_tokens": str(args.chunk_tokens),
            "checkpoint": "on",
            "retained_conversations": str(max(1, concurrency // args.ranks)),
        }
        fleets = {
            "unsized": {**common, "retained_snapshot_sizing": "off"},
            "sized": {**common, "retained_snapshot_sizing": "on"},
        }
        args.sessions = concurrency
        rows = await run_sim_arms(args, fleets)
        for name, measures, *_ in rows:  # the device state pool each arm's sizing gave a rank
            config = load_sim_config(args.model, fleets[name])
            measures["ssm_pages"] = rank_kvstore(config.fleet, config.model)[0].pool_pages["ssm"]
        out.append((concurrency, rows))
    return out


def print_table(results: list[tuple[int, list[tuple]]]) -> None:
    table = Table(title="retained-turn snapshot sizing (ratios to unsized, same concurrency)")
    for column in (
        "concurrency", "arm", "output tok/s", "prefix reuse", "later no reuse", "TTFT p90 s",
        "ITL p90 s", "tok/s x", "ITL p90 x", "ssm pages", "wall s",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for concurrency, rows in results:
        base = rows[0][1]
        for name, m, wall, _stats, _ in rows:
            table.add_row(
                str(concurrency),
                name,
                f"{m['output_tok_per_s']:.1f}",
                f"{m['prefix_reuse']:.3f}",
                f"{m['later_turns_no_reuse']:.3f}",
                f"{m['ttft_p90_s']:.2f}",
                "-" if m["itl_p90_s"] is None else f"{m['itl_p90_s']:.4f}",
                ratio(m["output_tok_per_s"], base["output_tok_per_s"]),
                ratio(m["itl_p90_s"], base["itl_p90_s"]),
                str(m["ssm_pages"]),
                f"{wall:.1f}",
            )
    Console(width=200).print(table)


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    print(
        f"{args.ranks} ranks x {args.slots} slots, {args.gpu_pages} GPU + {args.host_pages} host "
        f"pages/rank, chunk {args.chunk_tokens}, max_num_turns 3, time scale {args.time_scale}, "
        f"model {args.model.name}"
    )
    print_table(asyncio.run(run_all(args)))
    print(f"total wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
