"""Benchmark: aggregated vs disaggregated (context + generation pools) at equal total ranks.

Replays the Claude Code sessions of bench/sim_bench.py's best arm (strict affinity bounded in
time, per_conversation with 5 turns, context-end checkpoint, host tier; hybrid model; 2 slots
and 3000 GPU + 6000 host pages per rank) on the simulated fleet, once aggregated and once per
split of the same number of ranks, and prints one table with ratios to the aggregated arm.
Hand-off bytes per request are measured twice: skipping the blocks the generation rank holds
(what moves) and without skipping (every block the context rank has). Every arm ends with the
fleet's integrity checks (context and generation ranks, admission store).

Run: .venv/bin/python bench/sim_disagg_bench.py [--sessions 12] [--splits 2+2,3+1]
     [--plot docs/img/sim_disagg] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from kvfleet.services.replay.sim_target import SimTarget
from rich.console import Console
from rich.table import Table
from sim_bench import HYBRID_MODEL, TURNS_5, report, run_sim_arms

MIB = 1 << 20


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12, help="Claude Code files replayed")
    parser.add_argument("--ranks", type=int, default=4, help="aggregated arm; splits add up")
    parser.add_argument("--splits", default="2+2,3+1", help="context+generation, comma-separated")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--gpu-pages", type=int, default=3000, help="per rank")
    parser.add_argument("--host-pages", type=int, default=6000, help="per rank")
    parser.add_argument("--retained-conversations", type=int, default=3, help="per rank")
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--stagger", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", type=Path, default=HYBRID_MODEL, help="sim YAML")
    parser.add_argument("--plot", type=Path, default=None, help="write the PNGs into DIR")
    parser.add_argument("--json", type=Path, default=None, help="write the arms' measures")
    return parser.parse_args()


def arms(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """Arm name -> fleet overrides; the aggregated arm first (the baseline)."""
    result = {f"aggregated {args.ranks}": {"ranks": str(args.ranks)}}
    for split in args.splits.split(","):
        context, generation = (int(part) for part in split.split("+"))
        if context + generation != args.ranks:
            raise SystemExit(f"split {split}: {context + generation} ranks != {args.ranks}")
        result[f"disagg {context}+{generation}"] = {
            "context_ranks": str(context),
            "generation_ranks": str(generation),
        }
    return result


async def run_arms(args: argparse.Namespace) -> list[tuple]:
    common = {
        **TURNS_5,
        "checkpoint": "on",
        "slots": str(args.slots),
        "gpu_pages": str(args.gpu_pages),
        "host_pages": str(args.host_pages),
        "retained_conversations": str(args.retained_conversations),
    }
    fleets = {name: {**common, **overrides} for name, overrides in arms(args).items()}
    return await run_sim_arms(args, fleets, handoff_measures)


def handoff_measures(target: SimTarget, records) -> dict[str, float]:
    """Hand-off bytes per request (with and without skipping held blocks) and mean seconds."""
    handoffs = target.fleet.handoffs
    requests = len(records) or 1
    return {
        "handoffs": len(handoffs),
        "handoff_mib_per_request": sum(h.moved_bytes for h in handoffs) / MIB / requests,
        "unskipped_mib_per_request": sum(h.unskipped_bytes for h in handoffs) / MIB / requests,
        "handoff_ms_mean": 1e3 * sum(h.done_s - h.reserved_s for h in handoffs) / len(handoffs)
        if handoffs
        else 0.0,
        "handoff_wait_ms_mean": 1e3
        * sum(h.reserved_s - h.parked_s for h in handoffs)
        / len(handoffs)
        if handoffs
        else 0.0,
    }


def ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def print_table(rows: list[tuple]) -> None:
    table = Table(title="aggregated vs disaggregated at equal total ranks (ratios to aggregated)")
    for column in (
        "arm", "prefix reuse", "TTFT p50 s", "TTFT p90 s", "ITL p90 ms", "out tok/s", "req/s",
        "hand-off MiB/req", "no-skip MiB/req", "moved/no-skip", "hand-off ms", "queue ms",
        "TTFT p50 x", "TTFT p90 x", "ITL p90 x", "tok/s x", "wall s",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    base = rows[0][1]
    for name, m, wall, _stats, _ in rows:
        unskipped = m["unskipped_mib_per_request"]
        table.add_row(
            name,
            f"{m['prefix_reuse']:.3f}",
            f"{m['ttft_p50_s']:.2f}",
            f"{m['ttft_p90_s']:.2f}",
            f"{1e3 * m['itl_p90_s']:.1f}",
            f"{m['output_tok_per_s']:.1f}",
            f"{m['req_per_s']:.3f}",
            f"{m['handoff_mib_per_request']:.0f}",
            f"{unskipped:.0f}",
            f"{m['handoff_mib_per_request'] / unskipped:.3f}" if unskipped else "-",
            f"{m['handoff_ms_mean']:.1f}",
            f"{m['handoff_wait_ms_mean']:.0f}",
            ratio(m["ttft_p50_s"], base["ttft_p50_s"]),
            ratio(m["ttft_p90_s"], base["ttft_p90_s"]),
            ratio(m["itl_p90_s"], base["itl_p90_s"]),
            ratio(m["output_tok_per_s"], base["output_tok_per_s"]),
            f"{wall:.1f}",
        )
    Console(width=220).print(table)


def main() -> None:
    args = parse_args()
    print(
        f"{args.sessions} sessions, {args.ranks} ranks x {args.slots} slots, "
        f"{args.gpu_pages} GPU + {args.host_pages} host pages/rank, "
        f"time scale {args.time_scale}, model {args.model.name}"
    )
    report(asyncio.run(run_arms(args)), args, print_table)


if __name__ == "__main__":
    main()
