"""Benchmark: router and kvstore policies on a saturated, memory-pressed simulated fleet.

Replays ~12 Claude Code sessions (../shared/traces/claude_code_weka) through `--target sim`
arms that differ in one policy at a time, all in one run, and prints one table with ratios to
the lenient baseline. The fleet is saturated (fewer slots than concurrent sessions, so turns
queue) and memory-pressed (GPU pages below the sessions' working set), where DESIGN.md says
the difference shows. Every arm ends with the fleet's integrity checks.

Run: .venv/bin/python bench/sim_bench.py [--sessions 12] [--gpu-pages 3000] [--host-pages 6000]
     [--plot docs/img/sim_bench] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.plots import write_plots
from kvfleet.services.replay.readers import (
    ReadOptions,
    cap_output_tokens,
    filter_max_model_len,
    first_turns,
    read_traces,
)
from kvfleet.services.replay.runner import run_arm
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.tokens import TokenSynthesizer
from rich.console import Console
from rich.table import Table

# The repo's ../shared; KVFLEET_SHARED names the shared folder when the checkout lives
# elsewhere (a git worktree).
SHARED = Path(
    os.environ.get("KVFLEET_SHARED") or Path(__file__).resolve().parents[1] / ".." / "shared"
)
TRACES = SHARED / "traces" / "claude_code_weka"
HYBRID_MODEL = Path(__file__).resolve().parent / "sim_hybrid.yaml"

# Strict affinity's wait bound in time only: the router runs a pass every 50 ms tick while
# requests wait, so a bound of 4 passes ends the wait after ~0.2 s, far below a turn's service
# time (a 100k-token prefill is ~6 s); the "strict, 4-pass bound" row shows that.
STRICT = {"affinity": "strict", "max_wait_passes": "1000000", "max_wait_seconds": "30"}
TURNS_5 = {**STRICT, "reuse_policy": "per_conversation", "max_num_turns": "5"}
# name -> fleet overrides on top of the common ones; the first arm is the baseline.
ARMS: dict[str, dict[str, str]] = {
    "lenient": {"affinity": "lenient", "reuse_policy": "per_request", "checkpoint": "off"},
    "strict, 4-pass bound": {
        "affinity": "strict",
        "max_wait_passes": "4",
        "max_wait_seconds": "5",
        "reuse_policy": "per_request",
        "checkpoint": "off",
    },
    "strict": {**STRICT, "reuse_policy": "per_request", "checkpoint": "off"},
    "strict+turns5 (sized)": {**TURNS_5, "checkpoint": "off"},
    "+ckpt": {**TURNS_5, "checkpoint": "on"},
    # strict 30 s, per_conversation 5 turns, checkpoint: what a fleet gets by default.
    "shipped defaults + host": {},
}
HOST_ARM = "shipped defaults + host"


def session_files(half: str, limit: int | None = None) -> list[Path]:
    """The shared sessions of one half: files ordered by the SHA-256 of their name, then
    alternately `tune` and `report` (106 each), so the split is fixed and not by capture order;
    `all` is every file. Sorted by name; the first `limit` when given."""
    files = sorted(TRACES.glob("trace_*.json"))
    if half != "all":
        hashed = sorted(files, key=lambda path: hashlib.sha256(path.stem.encode()).hexdigest())
        files = sorted(hashed[{"tune": 0, "report": 1}[half] :: 2])
    return files[:limit]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12, help="Claude Code files replayed")
    parser.add_argument(
        "--half", choices=("all", "tune", "report"), default="all", help="which shared sessions"
    )
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--gpu-pages", type=int, default=3000, help="per rank")
    parser.add_argument("--host-pages", type=int, default=6000, help="per rank, host arm only")
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--stagger", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--retained-conversations",
        type=int,
        default=3,
        help="per rank, what plan_pools sizes retained turns for (sessions / ranks)",
    )
    parser.add_argument("--model", type=Path, default=HYBRID_MODEL, help="sim YAML")
    parser.add_argument("--plot", type=Path, default=None, help="write the PNGs into DIR")
    parser.add_argument("--json", type=Path, default=None, help="write the arms' measures")
    return parser.parse_args()


async def run_sim_arms(
    args: argparse.Namespace,
    fleets: dict[str, dict[str, str]],
    extra_measures: Callable[[SimTarget, list], dict] | None = None,
    attach: Callable[[SimTarget], object] | None = None,
) -> list[tuple]:
    """Replay the same sessions on each arm's fleet; rows of (name, measures, wall s, stats,
    result). `extra_measures(target, records)` adds an arm's own figures to its measures;
    `attach(target)` runs on each arm's fleet before its replay (a tracer)."""
    files = getattr(args, "files", None) or session_files(
        getattr(args, "half", "all"), args.sessions
    )
    conversations = filter_max_model_len(read_traces(files, ReadOptions()), args.max_model_len)
    if getattr(args, "max_turns", None) is not None:
        conversations = first_turns(conversations, args.max_turns)
    if getattr(args, "max_tokens", None) is not None:
        conversations = cap_output_tokens(conversations, args.max_tokens)
    options = DriverOptions(len(conversations), args.time_scale, args.stagger)
    rows = []
    for name, fleet in fleets.items():
        target = SimTarget(load_sim_config(args.model, fleet))
        if attach is not None:
            attach(target)
        started = time.perf_counter()
        try:
            result = await run_arm(
                name, target, conversations, TokenSynthesizer(args.seed, 32000), options, {}
            )
        finally:
            await target.aclose()
        if result.errors:
            raise SystemExit(f"{name}: {len(result.errors)} failed: {result.errors[0].error}")
        measures = result.measures.to_json()
        if extra_measures is not None:
            measures.update(extra_measures(target, result.records))
        measures["config"] = target.config.to_json()
        rows.append((name, measures, time.perf_counter() - started, target.stats(), result))
    return rows


async def run_arms(args: argparse.Namespace) -> list[tuple]:
    common = {
        "ranks": str(args.ranks),
        "slots": str(args.slots),
        "gpu_pages": str(args.gpu_pages),
        "retained_conversations": str(args.retained_conversations),
    }
    fleets = {name: {**common, **overrides} for name, overrides in ARMS.items()}
    fleets[HOST_ARM]["host_pages"] = str(args.host_pages)
    return await run_sim_arms(args, fleets)


def report(rows: list[tuple], args: argparse.Namespace, print_table) -> None:
    """The table, then the plots (`--plot`) and the measures (`--json`) when asked."""
    print_table(rows)
    if args.plot is not None:
        paths = write_plots({name: result.records for name, *_, result in rows}, args.plot)
        print("plots:", ", ".join(str(path) for path in paths))
    if args.json is not None:
        args.json.write_text(json.dumps({name: m for name, m, *_ in rows}, indent=1))


def ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def print_table(rows: list[tuple]) -> None:
    table = Table(title="sim arms (ratios to lenient, same run)")
    for column in (
        "arm", "prefix reuse", "oracle", "reuse/oracle", "later no reuse", "req/s",
        "TTFT p50 s", "TTFT p90 s", "reuse x", "req/s x", "TTFT p90 x", "deferrals",
        "preempt", "released", "wall s",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    base = rows[0][1]
    for name, m, wall, stats, _ in rows:
        table.add_row(
            name,
            f"{m['prefix_reuse']:.3f}",
            f"{m['oracle_reuse']:.3f}",
            f"{m['prefix_reuse'] / m['oracle_reuse']:.3f}",
            f"{m['later_turns_no_reuse']:.3f}",
            f"{m['req_per_s']:.3f}",
            f"{m['ttft_p50_s']:.2f}",
            f"{m['ttft_p90_s']:.2f}",
            ratio(m["prefix_reuse"], base["prefix_reuse"]),
            ratio(m["req_per_s"], base["req_per_s"]),
            ratio(m["ttft_p90_s"], base["ttft_p90_s"]),
            str(stats["deferrals"]),
            str(stats["preemptions"]),
            str(stats["released_conversations"]),
            f"{wall:.1f}",
        )
    Console(width=200).print(table)


def main() -> None:
    args = parse_args()
    print(
        f"{args.sessions} sessions, {args.ranks} ranks x {args.slots} slots, "
        f"{args.gpu_pages} GPU pages/rank, host arm {args.host_pages} pages/rank, "
        f"time scale {args.time_scale}, model {args.model.name}"
    )
    report(asyncio.run(run_arms(args)), args, print_table)


if __name__ == "__main__":
    main()
