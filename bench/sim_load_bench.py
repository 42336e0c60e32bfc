"""Benchmark: the design's load shape on a simulated fleet, one policy change at a time.

Each session starts at a sampled turn (seeded), warmed by the turn before it (sent first, not
measured); `--concurrency` sessions run at once with their real think times, a finished one
replaced by the next, so ranks run at `max_batch_size`; turns arriving in the measured window
(`--window-min` simulated minutes, opening `--warmup-min` after the start in every arm, once
the first sessions' warm-up turns are done) are measured. Arms:
the baseline (lenient affinity, per_request, no checkpoint, no host tier), each change alone,
and all of them (the shipped defaults plus a host tier). Columns: the design's (req/s, output
tok/s over the window; prefix reuse, later turns with no reuse, TTFT p50/p90 of the measured
turns) and the per-5-minute reuse plot (`--plot`).

Run: nice -n 10 .venv/bin/python bench/sim_load_bench.py [--half report] [--concurrency 48]
     [--ranks 4] [--slots 8] [--gpu-pages 12800] [--host-pages 12800] [--seed 1] [--plot DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import time
from pathlib import Path

from kvfleet.services.replay.driver import DriverOptions, LoadDriver
from kvfleet.services.replay.measures import compute_measures
from kvfleet.services.replay.model import Conversation, Turn
from kvfleet.services.replay.oracle import PrefixOracle
from kvfleet.services.replay.plots import write_plots
from kvfleet.services.replay.readers import ReadOptions, filter_max_model_len, read_traces
from kvfleet.services.replay.runner import turn_index
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.tokens import TokenSynthesizer
from rich.console import Console
from rich.table import Table
from sim_bench import HYBRID_MODEL, session_files

BASELINE = {"affinity": "lenient", "reuse_policy": "per_request", "checkpoint": "off"}
CHANGES = {
    "strict affinity": {"affinity": "strict"},
    "retention (per_conversation)": {"reuse_policy": "per_conversation"},
    "checkpoint": {"checkpoint": "on", "reuse_policy": "per_conversation"},
    "host tier": {},  # host pages added below
}
ALL = "all (shipped defaults + host tier)"


def warmed(conversation: Conversation, rng: random.Random) -> tuple[Conversation, int] | None:
    """The conversation from the turn before a sampled start turn on, and that warm turn's
    index; None with fewer than two turns."""
    turns = [step for step in conversation.steps if isinstance(step, Turn)]
    if len(turns) < 2:
        return None
    warm = turns[rng.randrange(1, len(turns)) - 1]
    position = conversation.steps.index(warm)
    return dataclasses.replace(conversation, steps=conversation.steps[position:]), warm.index


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", choices=("all", "tune", "report"), default="report")
    parser.add_argument("--sessions", type=int, default=None, help="first N files of the half")
    parser.add_argument("--concurrency", type=int, default=48, help="sessions at once")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--gpu-pages", type=int, default=12800, help="per rank (H200, 8B)")
    parser.add_argument("--host-pages", type=int, default=12800, help="per rank, host arms")
    parser.add_argument("--window-min", type=float, default=30.0)
    parser.add_argument("--warmup-min", type=float, default=5.0, help="before the window opens")
    parser.add_argument("--stagger", type=float, default=1.0)
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--arms", default=None, help="comma-separated arm names (default all)")
    parser.add_argument("--model", type=Path, default=HYBRID_MODEL, help="sim YAML")
    parser.add_argument("--plot", type=Path, default=None, help="write the PNGs into DIR")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args()


def arms(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    common = {"ranks": str(args.ranks), "slots": str(args.slots), "gpu_pages": str(args.gpu_pages)}
    fleets = {"baseline": {**common, **BASELINE}}
    for name, change in CHANGES.items():
        fleets[f"+ {name}"] = {**common, **BASELINE, **change}
    fleets["+ host tier"]["host_pages"] = str(args.host_pages)
    fleets[ALL] = {**common, "host_pages": str(args.host_pages)}
    if args.arms:
        fleets = {name: fleets[name] for name in args.arms.split(",")}
    return fleets


async def run_one(name, fleet, conversations, warm, args) -> dict:
    """Replay the warmed sessions on one fleet; the window's measures."""
    target = SimTarget(load_sim_config(args.model, fleet))
    window_s = args.window_min * 60
    started = time.perf_counter()
    # The window opens at the same time in every arm (`--warmup-min`), after the first
    # sessions' warm-up turns; no turn is sent after it closes.
    start = args.warmup_min * 60
    options = DriverOptions(args.concurrency, 1.0, args.stagger, stop_s=start + window_s)
    driver = LoadDriver(target, TokenSynthesizer(args.seed, 32000), options)
    try:
        records = await driver.run(conversations)
    finally:
        await target.aclose()
    end = start + window_s
    oracle, turns = PrefixOracle(), turn_index(conversations)
    measured, oracle_reused, oracle_prompt = [], 0, 0
    for record in sorted((r for r in records if r.ok), key=lambda r: r.arrival_s):
        match = oracle.offer(turns[(record.conversation_id, record.turn_index)])
        is_warm = warm.get(record.conversation_id) == record.turn_index
        if not is_warm and start <= record.arrival_s < end:
            measured.append(record)
            oracle_reused += match.reused_tokens
            oracle_prompt += match.prompt_tokens
    m = compute_measures(measured, oracle_reused / max(1, oracle_prompt)).to_json()
    done = [r for r in records if r.ok and start <= r.finish_s < end]
    tokens = sum(1 for r in records if r.ok for t in r.token_times_s if start <= t < end)
    m.update(req_per_s=len(done) / window_s, output_tok_per_s=tokens / window_s)
    m["errors"] = sum(1 for r in records if not r.ok)
    m["stats"], m["wall_s"] = target.stats(), time.perf_counter() - started
    m["records"] = [dataclasses.replace(r, arrival_s=r.arrival_s - start) for r in measured]
    return m


def print_table(results: dict[str, dict], args: argparse.Namespace) -> None:
    table = Table(title=f"design load shape: {args.concurrency} sessions at once on {args.ranks} "
                  f"ranks x {args.slots} slots, {args.gpu_pages} GPU pages/rank, window "
                  f"{args.window_min:.0f} min, seed {args.seed}")  # fmt: skip
    columns = ("arm", "req/s", "out tok/s", "prefix reuse", "of oracle", "later no reuse",
               "TTFT p50 s", "TTFT p90 s", "tok/s x", "TTFT p90 x", "turns", "wall s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    base = next(iter(results.values()))
    for name, m in results.items():
        table.add_row(
            name,
            f"{m['req_per_s']:.2f}",
            f"{m['output_tok_per_s']:.0f}",
            f"{m['prefix_reuse']:.3f}",
            f"{m['prefix_reuse'] / max(m['oracle_reuse'], 1e-9):.3f}",
            f"{m['later_turns_no_reuse']:.3f}",
            f"{m['ttft_p50_s']:.2f}",
            f"{m['ttft_p90_s']:.2f}",
            f"{m['output_tok_per_s'] / max(base['output_tok_per_s'], 1e-9):.2f}x",
            f"{m['ttft_p90_s'] / max(base['ttft_p90_s'], 1e-9):.2f}x",
            str(m["requests"]),
            f"{m['wall_s']:.0f}",
        )
    Console(width=220).print(table)


async def run(args: argparse.Namespace) -> dict[str, dict]:
    rng = random.Random(args.seed)
    read = read_traces(session_files(args.half, args.sessions), ReadOptions())
    picked = [w for c in filter_max_model_len(read, args.max_model_len) if (w := warmed(c, rng))]
    rng.shuffle(picked)
    conversations = [c for c, _ in picked]
    warm = {c.conversation_id: index for c, index in picked}
    return {
        name: await run_one(name, fleet, conversations, warm, args)
        for name, fleet in arms(args).items()
    }


def main() -> None:
    args = parse_args()
    results = asyncio.run(run(args))
    print_table(results, args)
    if args.plot is not None:
        paths = write_plots({name: m["records"] for name, m in results.items()}, args.plot)
        print("plots:", ", ".join(str(path) for path in paths))
    if args.json is not None:
        slim = {name: {k: v for k, v in m.items() if k != "records"} for name, m in results.items()}
        args.json.write_text(json.dumps(slim, indent=1, default=str))


if __name__ == "__main__":
    main()
