"""Prefetch during the tool pause and moving a conversation with its KV: each switch off and on.

Replays one half of the shared Claude Code sessions on the simulator (`sim_bench.run_sim_arms`)
per (seed, stagger) and arm, and prints per arm: TTFT p50/p90 of later turns, later turns with
no reuse, tokens recomputed by turns placed away from their home, host/disk bytes moved up
(admissions + prefetches), bytes pulled from a home or the shared disk, and with `--drain
RANK@SECONDS` the moves after that drain that recomputed a prefix their home had retained.

Run: nice -n 10 .venv/bin/python bench/sim_prefetch_bench.py --half tune --sessions 12 \
     --ranks 4 --slots 4 --gpu-pages 3000 --host-pages 3000 [--drain rank-1@600] [--json OUT]
     [--hardware admit_ms=30,admit_ms_per_host_page=0.19]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sim_bench import HYBRID_MODEL, run_sim_arms
from sim_yaml import with_hardware_figures

ARMS: dict[str, dict[str, str]] = {
    "off": {"prefetch": "off", "migrate_kv": "off"},
    "prefetch": {"prefetch": "on", "migrate_kv": "off"},
    "migrate": {"prefetch": "off", "migrate_kv": "on"},
    "both": {"prefetch": "on", "migrate_kv": "on"},
    "both/5s": {"prefetch": "on", "migrate_kv": "on", "max_wait_seconds": "5"},
    "both/2s": {"prefetch": "on", "migrate_kv": "on", "max_wait_seconds": "2"},
    "off/5s": {"prefetch": "off", "migrate_kv": "off", "max_wait_seconds": "5"},
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", choices=("all", "tune", "report"), default="tune")
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--gpu-pages", type=int, default=12000)
    parser.add_argument("--host-pages", type=int, default=6000)
    parser.add_argument("--disk-pages", type=int, default=0)
    parser.add_argument("--retained-conversations", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--staggers", default="2,5")
    parser.add_argument("--arms", default="off,prefetch,migrate,both")
    parser.add_argument("--drain", default="", help="RANK@SECONDS: that rank drains then")
    parser.add_argument("--set", default="", help="fleet overrides for every arm: k=v,k=v")
    parser.add_argument("--model", type=Path, default=HYBRID_MODEL)
    parser.add_argument(
        "--hardware",
        default="",
        help="hardware figures over the model file's: k=v,k=v (admit_ms=30,"
        "admit_ms_per_host_page=0.19: the H100 fleet's admission, docs/sim-vs-live.md)",
    )
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args()


def later_turn_measures(target, records) -> dict:
    """The figures of this bench, from the records and the fleet's moves."""
    moves = target.fleet.moves
    later = [r for r in records if r.ok and r.turn_index >= 1]
    ttfts = sorted(r.ttft_s for r in later if r.ttft_s is not None)
    holds = [rank.hold_stats for rank in (*target.fleet.ranks.values(), *moves.departed.values())]
    drained = [m for m in moves.moved if m.after_drain and m.home_had_tokens > 0]
    return {
        "later_ttft_p50_s": _quantile(ttfts, 0.5),
        "later_ttft_p90_s": _quantile(ttfts, 0.9),
        "moved_turns": len(moves.moved),
        "recomputed_after_move": sum(
            m.request.prompt_len - (m.request.cached_tokens or 0) for m in moves.moved
        ),
        "host_bytes_in": moves.host_bytes_in + sum(h.host_bytes_in for h in holds),
        "disk_bytes_in": moves.disk_bytes_in + sum(h.disk_bytes_in for h in holds),
        "pulled_bytes": sum(h.imported_bytes for h in holds),
        "prefetches": sum(h.prefetches for h in holds),
        "holds_taken": sum(h.taken for h in holds),
        "holds_late": sum(h.late for h in holds),
        "holds_cancelled": sum(h.cancelled for h in holds),
        "drained_moves": len(drained),
        "drained_full_recomputes": sum(
            1 for m in drained if (m.request.cached_tokens or 0) < 0.02 * m.request.prompt_len
        ),
        "flushed_blocks": moves.flushed_blocks,
    }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


async def run(args: argparse.Namespace) -> dict[str, list[dict]]:
    common = {
        "ranks": str(args.ranks),
        "slots": str(args.slots),
        "gpu_pages": str(args.gpu_pages),
        "host_pages": str(args.host_pages),
        "disk_pages": str(args.disk_pages),
        "retained_conversations": str(args.retained_conversations),
    }
    if args.drain:
        rank, _, at = args.drain.partition("@")
        common |= {"drain_rank": rank, "drain_at_s": at}
    extra = dict(item.split("=", 1) for item in args.set.split(",") if item)
    fleets = {name: {**common, **ARMS[name], **extra} for name in args.arms.split(",")}
    runs: dict[str, list[dict]] = {name: [] for name in fleets}
    for seed in (int(s) for s in args.seeds.split(",")):
        for stagger in (float(s) for s in args.staggers.split(",")):
            run_args = argparse.Namespace(**{**vars(args), "seed": seed, "stagger": stagger})
            rows = await run_sim_arms(run_args, fleets, later_turn_measures)
            for name, measures, wall, stats, _ in rows:
                runs[name].append({**measures, "wall_s": wall, "stats": stats})
    return runs


def spread(values: list, digits: int, scale: float = 1.0) -> str:
    values = [v / scale for v in values if v is not None]
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


COLUMNS = (
    ("later TTFT p50 s", "later_ttft_p50_s", 2, 1),
    ("later TTFT p90 s", "later_ttft_p90_s", 2, 1),
    ("later no reuse", "later_turns_no_reuse", 3, 1),
    ("reuse/oracle", None, 3, 1),
    ("moved turns", "moved_turns", 0, 1),
    ("recomputed after move Mtok", "recomputed_after_move", 2, 1e6),
    ("host->GPU GB", "host_bytes_in", 1, 1e9),
    ("disk->GPU GB", "disk_bytes_in", 1, 1e9),
    ("pulled GB", "pulled_bytes", 1, 1e9),
    ("holds taken / late / cancelled", ("holds_taken", "holds_late", "holds_cancelled"), 0, 1),
    ("drained moves", "drained_moves", 0, 1),
    ("full recomputes after drain", "drained_full_recomputes", 0, 1),
    ("wall s", "wall_s", 0, 1),
)


def print_table(runs: dict[str, list[dict]], args: argparse.Namespace) -> None:
    table = Table(title=f"half {args.half}, {args.sessions} sessions: mean (min-max) over "
                  f"seeds {args.seeds} x staggers {args.staggers}")  # fmt: skip
    table.add_column("arm")
    for title, *_ in COLUMNS:
        table.add_column(title, justify="right")
    for name, items in runs.items():
        cells = []
        for _, key, digits, scale in COLUMNS:
            if key is None:
                values = [m["prefix_reuse"] / m["oracle_reuse"] for m in items]
            elif isinstance(key, tuple):
                cells.append(" / ".join(spread([m[k] for m in items], digits) for k in key))
                continue
            else:
                values = [m[key] for m in items]
            cells.append(spread(values, digits, scale))
        table.add_row(name, *cells)
    Console(width=260).print(table)


def with_hardware(args: argparse.Namespace, folder: Path) -> argparse.Namespace:
    """`--hardware k=v,...` over the model file's hardware section: a merged file in `folder`."""
    model = with_hardware_figures(args.model, args.hardware, folder)
    return argparse.Namespace(**{**vars(args), "model": model})


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as folder:
        runs = asyncio.run(run(with_hardware(args, Path(folder))))
    print_table(runs, args)
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1, default=str))


if __name__ == "__main__":
    main()
