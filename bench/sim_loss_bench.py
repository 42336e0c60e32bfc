"""Where reuse is lost: per later turn that reuses less than the oracle, why (`loss_tracer`).

Runs sim_sweep's settings (default: the shipped defaults) on one half of the sessions with a
tracer on every rank's kvstore, then prints per reason: later turns with no reuse that the
oracle would have reused, the tokens lost against the (replay-capped) oracle, and how many of
those turns are sub-agents' or long sessions' (turn >= `--long-turn`). The first rows are the
measures the replay reports, so the breakdown adds up to a figure of the same run.

Run: nice -n 10 .venv/bin/python bench/sim_loss_bench.py --half tune --sessions 40 --ranks 8 \
       --gpu-pages 3000 --host-pages 3000 --retained-conversations 4 --seeds 1,2 [--arms defaults]
The 1b H200 fleet (docs/sim-vs-live.md): its 12 files (`--files`, fleet_sizing.report_half),
`--max-turns 24 --max-tokens 64 --time-scale 0 --stagger 1 --model
bench/gpu/sim_1b_h200_shared.yaml --set block_size=16,gpu_gib=6.6995,host_gib=3.3497`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict
from pathlib import Path

from loss_tracer import LossTracer, is_sub_agent, later_no_reuse
from rich.console import Console
from rich.table import Table
from sim_bench import HYBRID_MODEL, run_sim_arms
from sim_sweep import SETTINGS, fleet_settings, overrides


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", choices=("all", "tune", "report"), default="tune")
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--gpu-pages", type=int, default=3000)
    parser.add_argument("--host-pages", type=int, default=3000)
    parser.add_argument("--retained-conversations", type=int, default=4)
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--stagger", type=float, default=5.0)
    parser.add_argument("--arms", default="defaults")
    parser.add_argument("--set", default="", help="extra fleet overrides: k=v,k=v")
    parser.add_argument("--long-turn", type=int, default=20)
    parser.add_argument("--examples", type=int, default=0, help="print N lost turns per reason")
    parser.add_argument("--model", default=HYBRID_MODEL)
    parser.add_argument(
        "--files",
        type=Path,
        nargs="*",
        default=None,
        help="these trace files instead of the half's first --sessions",
    )
    parser.add_argument(
        "--max-turns", type=int, default=None, help="first N turns per conversation"
    )
    parser.add_argument("--max-tokens", type=int, default=None, help="output cap per turn")
    return parser.parse_args()


def tracers_of(tracers: list[LossTracer]):
    """An `attach` that puts a tracer on each target and keeps it in `tracers`."""
    return lambda target: tracers.append(LossTracer(target))


async def run(args: argparse.Namespace) -> list[tuple]:
    extra = overrides(args.set)
    common = fleet_settings(args)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in args.arms.split(","):
            tracers: list[LossTracer] = []
            run_args = argparse.Namespace(**{**vars(args), "seed": seed})
            fleets = {name: {**common, **SETTINGS[name], **extra}}
            try:
                result = await run_sim_arms(run_args, fleets, attach=tracers_of(tracers))
            finally:
                for tracer in tracers:
                    tracer.close()
            _, measures, wall, stats, _ = result[0]
            rows.append((f"{name} seed {seed}", measures, stats, tracers[0].losses, wall))
    return rows


def print_examples(by_reason: dict[str, list], count: int) -> None:
    for reason, items in by_reason.items():
        for x in [x for x in items if later_no_reuse(x)][:count]:
            print(f"  {reason}: {x.conversation_id} turn {x.turn_index}: prompt {x.prompt_tokens}"
                  f" (previous {x.previous_prompt_tokens}), reused {x.reused_tokens}, oracle "
                  f"{x.oracle_tokens}")  # fmt: skip


def print_tables(rows: list[tuple], long_turn: int, examples: int = 0) -> None:
    for name, m, stats, losses, wall in rows:
        later = [loss for loss in losses if loss.turn_index >= 1]
        oracle_tokens = sum(loss.uncapped_tokens for loss in losses) or 1
        title = (
            f"{name}: reuse/oracle {m['prefix_reuse'] / m['oracle_reuse']:.3f}, later no reuse "
            f"{m['later_turns_no_reuse']:.3f} ({m['later_turns']} later turns), fallbacks "
            f"{stats['placements'].get('fallback', 0)}, released {stats['released_conversations']}"
            f", preempted {stats['preemptions']}, {wall:.0f} s"
        )
        table = Table(title=title)
        for column in ("reason", "later no reuse", "of later turns", "sub-agent", "long",
                       "tokens lost / oracle", "turns short"):  # fmt: skip
            table.add_column(column, justify="right")
        by_reason: dict[str, list] = defaultdict(list)
        for loss in losses:
            if loss.reason:
                by_reason[loss.reason].append(loss)
        oracle_none = [x for x in later if later_no_reuse(x) and not x.reason]
        by_reason["(oracle reuses nothing either)"] = oracle_none
        capped = sum(loss.uncapped_tokens - loss.oracle_tokens for loss in losses)
        ordered = sorted(by_reason.items(), key=lambda kv: -sum(map(later_no_reuse, kv[1])))
        for reason, items in ordered:
            none = [x for x in items if later_no_reuse(x)]
            lost = sum(x.oracle_tokens - x.reused_tokens for x in items)
            table.add_row(
                reason,
                str(len(none)),
                f"{len(none) / max(1, len(later)):.3f}",
                str(sum(is_sub_agent(x.conversation_id) for x in none)),
                str(sum(x.turn_index >= long_turn for x in none)),
                f"{lost / oracle_tokens:.4f}",
                str(len(items)),
            )
        table.add_row("(replay cap: the last tokens)", "-", "-", "-", "-",
                      f"{capped / oracle_tokens:.4f}", "-")  # fmt: skip
        Console(width=220).print(table)
        print_examples(by_reason, examples)


def main() -> None:
    args = parse_args()
    print_tables(asyncio.run(run(args)), args.long_turn, args.examples)


if __name__ == "__main__":
    main()
