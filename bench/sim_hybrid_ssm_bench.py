"""Benchmark: pools sized for the retained turns' from-end state snapshots, on a hybrid model.

Replays Claude Code sessions of one half through the simulator with the hybrid SSM preset
(bench/sim_hybrid_ssm.yaml: SSM layers with a snapshot 2048 tokens before each prompt's end,
beside window and full attention), `per_conversation` with max_num_turns 3 and a host tier, at
each concurrency (sessions replayed at once), with and without pool sizing that counts the
snapshots retained turns keep. A rank's KV is bytes (`--gpu-gib`, `--host-gib`), split between
pools by each pool's page bytes (an SSM snapshot is 49 attention pages). The unsized arm is the
baseline of its concurrency; each figure is the mean over the runs of every `--seeds` x
`--staggers` pair (min-max in brackets). The seed only picks the synthesized token ids, which
leave a simulated run's records unchanged; the stagger (seconds between session starts)
changes which turns meet on a rank.

Run: nice -n 10 .venv/bin/python bench/sim_hybrid_ssm_bench.py --half tune [--concurrency 32,64]
     [--seeds 1] [--staggers 2,5,8] [--gpu-gib 20] [--host-gib 10] [--chunk-tokens 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_sizing import rank_kvstore
from rich.console import Console
from rich.table import Table
from sim_bench import STRICT, run_sim_arms

SSM_MODEL = Path(__file__).resolve().parent / "sim_hybrid_ssm.yaml"
ARMS = {"unsized": "off", "sized": "on"}  # retained_snapshot_sizing; the first is the baseline
FIGURES = {  # measure -> (column, format)
    "output_tok_per_s": ("output tok/s", "{:.1f}"),
    "prefix_reuse": ("prefix reuse", "{:.3f}"),
    "later_turns_no_reuse": ("later no reuse", "{:.3f}"),
    "ttft_p90_s": ("TTFT p90 s", "{:.2f}"),
    "itl_p90_s": ("ITL p90 ms", "{:.1f}"),
    "released": ("released", "{:.0f}"),  # retained conversations released under pressure
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", choices=("all", "tune", "report"), default="tune")
    parser.add_argument("--concurrency", default="32,64", help="sessions replayed at once")
    parser.add_argument("--seeds", default="1", help="token synthesis seeds")
    parser.add_argument("--staggers", default="2,5,8", help="seconds between session starts")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--gpu-gib", type=float, default=20.0, help="device KV per rank")
    parser.add_argument("--host-gib", type=float, default=10.0, help="host tier per rank")
    parser.add_argument("--chunk-tokens", type=int, default=2048, help="prefill chunk")
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--model", type=Path, default=SSM_MODEL, help="sim YAML")
    return parser.parse_args()


def fleets_for(args: argparse.Namespace, concurrency: int) -> dict[str, dict[str, str]]:
    common = {
        **STRICT,
        "ranks": str(args.ranks),
        "slots": str(args.slots),
        "gpu_gib": str(args.gpu_gib),
        "host_gib": str(args.host_gib),
        "reuse_policy": "per_conversation",
        "max_num_turns": "3",
        "chunk_tokens": str(args.chunk_tokens),
        "checkpoint": "on",
        "retained_conversations": str(max(1, concurrency // args.ranks)),
    }
    return {name: {**common, "retained_snapshot_sizing": on} for name, on in ARMS.items()}


async def run_all(args: argparse.Namespace) -> list[tuple[int, str, list[dict], float, int]]:
    """Rows of (concurrency, arm, measures per run, wall s, device state pages per rank)."""
    out = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        fleets = fleets_for(args, concurrency)
        per_arm: dict[str, list[dict]] = {name: [] for name in fleets}
        walls = dict.fromkeys(fleets, 0.0)
        args.sessions = concurrency
        runs = [(int(s), float(g)) for s in args.seeds.split(",") for g in args.staggers.split(",")]
        for args.seed, args.stagger in runs:
            for name, measures, wall, stats, _ in await run_sim_arms(args, fleets):
                measures["released"] = stats["released_conversations"]
                per_arm[name].append(measures)
                walls[name] += wall
        for name, fleet in fleets.items():
            config = load_sim_config(args.model, fleet)
            ssm_pages = rank_kvstore(config.fleet, config.model)[0].pool_pages["ssm"]
            out.append((concurrency, name, per_arm[name], walls[name], ssm_pages))
    return out


def spread(values: list[float], fmt: str, scale: float = 1.0) -> str:
    """Mean (min-max) of `values` x `scale`."""
    scaled = [value * scale for value in values]
    mean = fmt.format(statistics.fmean(scaled))
    return f"{mean} ({fmt.format(min(scaled))}-{fmt.format(max(scaled))})"


def mean_of(runs: list[dict], key: str) -> float:
    return statistics.fmean(run[key] for run in runs if run[key] is not None)


def print_table(rows: list[tuple[int, str, list[dict], float, int]]) -> None:
    table = Table(title="retained-turn snapshot sizing: mean (min-max) over seeds x staggers")
    columns = ["concurrency", "arm", *(column for column, _ in FIGURES.values())]
    for column in (*columns, "tok/s x", "ITL p90 x", "ssm pages", "wall s"):
        table.add_column(column, justify="right")
    base: dict[int, list[dict]] = {}
    for concurrency, name, runs, wall, ssm_pages in rows:
        base.setdefault(concurrency, runs)
        cells = []
        for key, (_, fmt) in FIGURES.items():
            values = [run[key] for run in runs if run[key] is not None]
            scale = 1e3 if key == "itl_p90_s" else 1.0
            cells.append(spread(values, fmt, scale) if values else "-")
        ratios = [
            f"{mean_of(runs, key) / mean_of(base[concurrency], key):.2f}x"
            for key in ("output_tok_per_s", "itl_p90_s")
        ]
        table.add_row(str(concurrency), name, *cells, *ratios, str(ssm_pages), f"{wall:.0f}")
    Console(width=220).print(table)


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    print(
        f"half {args.half}, {args.ranks} ranks x {args.slots} slots, {args.gpu_gib:g} GiB GPU + "
        f"{args.host_gib:g} GiB host KV/rank, chunk {args.chunk_tokens}, max_num_turns 3, "
        f"seeds {args.seeds}, staggers {args.staggers} s, time scale {args.time_scale}, "
        f"model {args.model.name}"
    )
    print_table(asyncio.run(run_all(args)))
    print(f"total wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
