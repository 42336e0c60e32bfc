"""Sweep: router strict-bound, retention and checkpoint settings on one half of the sessions.

The shared Claude Code sessions are split in two fixed halves (`sim_bench.session_files`):
settings are chosen on `--half tune` and reported on `--half report`, which the choice never
saw. Every setting runs once per (seed, stagger); the table gives the mean and the spread
(min-max) of reuse/oracle, later turns with no reuse and TTFT p90, and the wall time.

Run: nice -n 10 .venv/bin/python bench/sim_sweep.py --half tune [--sessions 40] [--ranks 16]
     [--gpu-pages 6000] [--seeds 1,2] [--staggers 2,5] [--arms NAME,...] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sim_bench import HYBRID_MODEL, run_sim_arms

BOUND_4_PASSES = {"max_wait_passes": "4", "max_wait_seconds": "5"}


def bound(seconds: int) -> dict[str, str]:
    """Strict affinity bounded in time only."""
    return {"max_wait_passes": "1000000", "max_wait_seconds": str(seconds)}


# name -> fleet overrides (strict affinity, per_conversation, unless said): bound (4 passes
# and 5 s, or N seconds only), retained turns, checkpoint.
SETTINGS: dict[str, dict[str, str]] = {
    "lenient/t2": {"affinity": "lenient", "max_num_turns": "2"},
    "4p5s/t2": {**BOUND_4_PASSES, "max_num_turns": "2"},
    "30s/t2": {**bound(30), "max_num_turns": "2"},
    "10s/t5": {**bound(10), "max_num_turns": "5"},
    "30s/t5": {**bound(30), "max_num_turns": "5"},
    "60s/t5": {**bound(60), "max_num_turns": "5"},
    "30s/t5/no-ckpt": {**bound(30), "max_num_turns": "5", "checkpoint": "off"},
    "defaults/no-branch-points": {"keep_branch_points": "0"},  # the defaults before hints
    "defaults": {},
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", choices=("all", "tune", "report"), default="tune")
    parser.add_argument("--sessions", type=int, default=40, help="first N files of the half")
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--gpu-pages", type=int, default=6000, help="per rank")
    parser.add_argument("--host-pages", type=int, default=0, help="per rank")
    parser.add_argument("--retained-conversations", type=int, default=3, help="per rank")
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--staggers", default="5")
    parser.add_argument("--arms", default=",".join(SETTINGS), help="comma-separated names")
    parser.add_argument("--model", type=Path, default=HYBRID_MODEL, help="sim YAML")
    parser.add_argument("--json", type=Path, default=None, help="write every run's measures")
    parser.add_argument("--set", default="", help="fleet overrides for every arm: k=v,k=v")
    return parser.parse_args()


def overrides(text: str) -> dict[str, str]:
    """`--set k=v,k=v` as fleet settings."""
    return dict(item.split("=", 1) for item in text.split(",") if item)


def fleet_settings(args: argparse.Namespace) -> dict[str, str]:
    """The fleet shape every arm shares, as sim settings."""
    names = ("ranks", "slots", "gpu_pages", "host_pages", "retained_conversations")
    return {name: str(getattr(args, name)) for name in names}


async def sweep(args: argparse.Namespace) -> dict[str, list[dict]]:
    common = fleet_settings(args)
    extra = overrides(args.set)
    fleets = {name: {**common, **SETTINGS[name], **extra} for name in args.arms.split(",")}
    runs: dict[str, list[dict]] = {name: [] for name in fleets}
    for seed in (int(s) for s in args.seeds.split(",")):
        for stagger in (float(s) for s in args.staggers.split(",")):
            run_args = argparse.Namespace(**{**vars(args), "seed": seed, "stagger": stagger})
            for name, measures, wall, stats, _ in await run_sim_arms(run_args, fleets):
                runs[name].append({**measures, "wall_s": wall, "stats": stats})
    return runs


def spread(values: list[float], digits: int) -> str:
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def print_table(runs: dict[str, list[dict]], args: argparse.Namespace) -> None:
    table = Table(title=f"half {args.half}: mean (min-max) over seeds {args.seeds} x staggers "
                  f"{args.staggers}")  # fmt: skip
    for column in ("setting", "reuse/oracle", "later no reuse", "TTFT p90 s", "fallbacks",
                   "wall s"):  # fmt: skip
        table.add_column(column, justify="right")
    for name, items in runs.items():
        table.add_row(
            name,
            spread([m["prefix_reuse"] / m["oracle_reuse"] for m in items], 3),
            spread([m["later_turns_no_reuse"] for m in items], 3),
            spread([m["ttft_p90_s"] for m in items], 2),
            spread([m["stats"]["placements"].get("fallback", 0) for m in items], 0),
            spread([m["wall_s"] for m in items], 0),
        )
    Console(width=200).print(table)


def main() -> None:
    args = parse_args()
    runs = asyncio.run(sweep(args))
    print_table(runs, args)
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1, default=str))


if __name__ == "__main__":
    main()
