"""Benchmark: the design's load shape on a simulated fleet, one policy change at a time.

Each session starts at a sampled turn (seeded), warmed by the turn before it (sent first, not
measured); `--concurrency` sessions run at once with their think times (x `--time-scale`), a
finished one replaced by the next; when the half's conversations run out, further copies of
them (own ids and prompt blocks, another sampled start) keep the concurrency through the
window. Turns arriving in the measured window (`--window-min` simulated minutes, opening
`--warmup-min` after the start in every arm) are measured. `--context-servers`: the ranks
compute prefills only (one output token per turn, the design's prefill-bound context servers;
out tok/s counts the finished turns' trace output tokens, generated elsewhere). Arms: the
baseline (lenient affinity, per_request, no checkpoint, no host tier), each change alone, and
all of them (the shipped defaults plus a host tier). Columns: the design's (req/s, output tok/s
over the window; prefix reuse, later turns with no reuse, TTFT p50/p90 of the measured turns),
a load table (slots busy, router queue, prefill share of step time, reuse per 5 minutes) and
the per-5-minute reuse plot from the start (`--plot`). `--seeds 1,2`: mean (min-max).

Run: nice -n 10 .venv/bin/python bench/sim_load_bench.py [--half report] [--concurrency 48]
     [--ranks 4] [--slots 8] [--gpu-pages 12800] [--host-pages 12800] [--context-servers]
     [--time-scale 1] [--seeds 1,2] [--plot DIR] [--losses]
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
from kvfleet.services.replay.measures import compute_measures, reuse_by_window
from kvfleet.services.replay.model import Conversation, SubAgentSpawn, Turn
from kvfleet.services.replay.oracle import PrefixOracle
from kvfleet.services.replay.plots import write_plots
from kvfleet.services.replay.readers import ReadOptions, filter_max_model_len, read_traces
from kvfleet.services.replay.runner import turn_index
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.tokens import TokenSynthesizer
from loss_tracer import LossTracer
from rich.console import Console
from rich.table import Table
from sim_bench import HYBRID_MODEL, session_files
from sim_loss_bench import print_tables
from sim_sweep import overrides

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


def first_token_only(conversation: Conversation) -> Conversation:
    """The conversation with every turn (sub-agents' too) asking for one output token: what a
    context server computes (its prefill); generation runs on other servers, not simulated."""
    steps = []
    for step in conversation.steps:
        if isinstance(step, Turn):
            steps.append(dataclasses.replace(step, output_tokens=1))
        else:
            children = tuple((delay, first_token_only(child)) for delay, child in step.children)
            steps.append(SubAgentSpawn(children))
    return dataclasses.replace(conversation, steps=tuple(steps))


def replica(conversation: Conversation, copy: int) -> Conversation:
    """Copy `copy` of a conversation as another user's: its own ids and its own prompt blocks
    (namespace), sub-agents too; the prefix shared across sessions (system prompt, tools)
    stays shared. Copy 0 is the conversation itself."""
    if copy == 0:
        return conversation
    steps = []
    for step in conversation.steps:
        if isinstance(step, Turn):
            steps.append(dataclasses.replace(step, namespace=f"{step.namespace}~{copy}"))
        else:
            children = tuple((delay, replica(child, copy)) for delay, child in step.children)
            steps.append(SubAgentSpawn(children))
    cid = f"{conversation.conversation_id}~{copy}"
    return dataclasses.replace(conversation, conversation_id=cid, steps=tuple(steps))


def session_pool(
    conversations: list[Conversation], concurrency: int, rng: random.Random
) -> list[tuple[Conversation, int]]:
    """Warmed sessions, each from its own sampled start, enough that `concurrency` sessions
    stay busy through the window: the half's conversations, then further copies of them
    (`replica`), in a seeded order, at least 4 x concurrency in all."""
    pool: list[tuple[Conversation, int]] = []
    copy = 0
    while len(pool) < max(4 * concurrency, 1) and conversations:
        picked = [w for c in conversations if (w := warmed(replica(c, copy), rng))]
        if not picked:
            break
        rng.shuffle(picked)
        pool.extend(picked)
        copy += 1
    return pool


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
    parser.add_argument("--time-scale", type=float, default=1.0, help="think times x this")
    parser.add_argument(
        "--context-servers",
        action="store_true",
        help="ranks compute prefills only (one output token); out tok/s = the finished turns' "
        "trace output tokens (generated on other servers, not simulated)",
    )
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", default=None, help="comma-separated: a run per seed, then "
                        "the mean (min-max) table; the plot is the first seed's")  # fmt: skip
    parser.add_argument("--arms", default=None, help="comma-separated arm names (default all)")
    parser.add_argument("--set", default="", help="fleet overrides for every arm: k=v,k=v")
    parser.add_argument("--model", type=Path, default=HYBRID_MODEL, help="sim YAML")
    parser.add_argument("--plot", type=Path, default=None, help="write the PNGs into DIR")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--losses",
        action="store_true",
        help="trace every rank's kvstore and print, per arm, why each measured later turn "
        "reused less than the oracle (sim_loss_bench's table)",
    )
    return parser.parse_args()


def arms(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    common = {"ranks": str(args.ranks), "slots": str(args.slots), "gpu_pages": str(args.gpu_pages)}
    fleets = {"baseline": {**common, **BASELINE}}
    for name, change in CHANGES.items():
        fleets[f"+ {name}"] = {**common, **BASELINE, **change}
    fleets["+ host tier"]["host_pages"] = str(args.host_pages)
    fleets[ALL] = {**common, "host_pages": str(args.host_pages)}
    if args.arms:
        unknown = [name for name in args.arms.split(",") if name not in fleets]
        if unknown:
            raise SystemExit(f"--arms: unknown {unknown}; known: {list(fleets)}")
        fleets = {name: fleets[name] for name in args.arms.split(",")}
    extra = overrides(args.set)
    fleets = {name: {**fleet, **extra} for name, fleet in fleets.items()}
    return fleets


class LoadProbe:
    """Samples the fleet every `period_s` of virtual time inside the window (read-only, so
    the records are unchanged): the share of slots holding a request, and the router's queue."""

    def __init__(self, target: SimTarget, start_s: float, end_s: float, period_s: float) -> None:
        self.fleet, self.clock = target.fleet, target.clock
        self.end_s, self.period_s = end_s, period_s
        self.slots = len(self.fleet.ranks) * self.fleet.config.fleet.slots
        self.busy: list[float] = []
        self.active: list[float] = []
        self.queued: list[int] = []
        self.clock.call_at(start_s, self._sample)

    def _sample(self) -> None:
        ranks = self.fleet.ranks.values()
        held = sum(len(rank.running) + len(rank.waiting) for rank in ranks)
        self.busy.append(held / self.slots)
        self.active.append(sum(not rank.idle for rank in ranks) / len(self.fleet.ranks))
        self.queued.append(len(self.fleet.queue))
        if self.clock.now() + self.period_s < self.end_s:
            self.clock.call_at(self.clock.now() + self.period_s, self._sample)

    def summary(self) -> dict[str, float]:
        samples = max(1, len(self.busy))
        return {
            "slots_busy": sum(self.busy) / samples,
            "ranks_active": sum(self.active) / samples,
            "full_share": sum(b >= 1.0 for b in self.busy) / samples,
            "queue_mean": sum(self.queued) / samples,
            "queued_share": sum(q > 0 for q in self.queued) / samples,
        }


async def run_one(name, fleet, conversations, warm, args) -> dict:
    """Replay the warmed sessions on one fleet; the window's measures."""
    target = SimTarget(load_sim_config(args.model, fleet))
    window_s = args.window_min * 60
    started = time.perf_counter()
    # The window opens at the same time in every arm (`--warmup-min`), after the first
    # sessions' warm-up turns; no turn is sent after it closes.
    start = args.warmup_min * 60
    options = DriverOptions(
        args.concurrency, args.time_scale, args.stagger, stop_s=start + window_s
    )
    sent = [first_token_only(c) for c in conversations] if args.context_servers else conversations
    driver = LoadDriver(target, TokenSynthesizer(args.seed, 32000), options)
    probe = LoadProbe(target, start, start + window_s, period_s=5.0)
    tracer = LossTracer(target) if args.losses else None
    try:
        records = await driver.run(sent)
    finally:
        if tracer is not None:
            tracer.close()
        await target.aclose()
    end = start + window_s
    oracle, turns = PrefixOracle(), turn_index(conversations)
    measured, timeline, oracle_reused, oracle_prompt = [], [], 0, 0
    for record in sorted((r for r in records if r.ok), key=lambda r: r.arrival_s):
        match = oracle.offer(turns[(record.conversation_id, record.turn_index)])
        if warm.get(record.conversation_id) == record.turn_index:
            continue
        timeline.append(record)
        if start <= record.arrival_s < end:
            measured.append(record)
            oracle_reused += match.reused_tokens
            oracle_prompt += match.prompt_tokens
    m = compute_measures(measured, oracle_reused / max(1, oracle_prompt)).to_json()
    done = [r for r in records if r.ok and start <= r.finish_s < end]
    if args.context_servers:
        tokens = sum(turns[(r.conversation_id, r.turn_index)].output_tokens for r in done)
    else:
        tokens = sum(1 for r in records if r.ok for t in r.token_times_s if start <= t < end)
    m.update(req_per_s=len(done) / window_s, output_tok_per_s=tokens / window_s)
    m["errors"] = sum(1 for r in records if not r.ok)
    m["stats"], m["wall_s"] = target.stats(), time.perf_counter() - started
    m["load"] = probe.summary()
    m["load"]["prefill_step_share"] = m["stats"]["prefill_busy_s"] / max(m["stats"]["busy_s"], 1e-9)
    m["records"] = measured
    if tracer is not None:
        # The tracer numbers a conversation's requests in admission order (the warm turn is
        # its 0): the k-th record of a conversation by arrival is its turn k.
        order: dict[str, list] = {}
        for record in sorted((r for r in records if r.ok), key=lambda r: r.arrival_s):
            order.setdefault(record.conversation_id, []).append(record)
        window = {id(r) for r in measured}
        keys = {(c, k) for c, rs in order.items() for k, r in enumerate(rs) if id(r) in window}
        m["losses"] = [x for x in tracer.losses if (x.conversation_id, x.turn_index) in keys]
    # Reuse over time from the first measured-or-not turn on (the warm-up included), per 5 min.
    m["timeline"] = timeline
    m["reuse_per_5min"] = [round(reuse, 3) for _, reuse in reuse_by_window(timeline, 300.0)]
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
    load = Table(title="load in the window (sampled every 5 s) and prefix reuse per 5 minutes")
    for column in ("arm", "slots busy", "queue non-empty", "queue mean", "prefill share of "
                   "step time", "reuse per 5 min from the start (warm-up included)"):  # fmt: skip
        load.add_column(column, justify="right")
    for name, m in results.items():
        shape = m["load"]
        load.add_row(
            name,
            f"{shape['slots_busy']:.2f}",
            f"{shape['queued_share']:.2f}",
            f"{shape['queue_mean']:.1f}",
            f"{shape['prefill_step_share']:.2f}",
            " ".join(f"{reuse:.2f}" for reuse in m["reuse_per_5min"]),
        )
    Console(width=220).print(load)


async def run(args: argparse.Namespace) -> dict[str, dict]:
    rng = random.Random(args.seed)
    read = read_traces(session_files(args.half, args.sessions), ReadOptions())
    picked = session_pool(filter_max_model_len(read, args.max_model_len), args.concurrency, rng)
    conversations = [c for c, _ in picked]
    warm = {c.conversation_id: index for c, index in picked}
    return {
        name: await run_one(name, fleet, conversations, warm, args)
        for name, fleet in arms(args).items()
    }


SPREAD_COLUMNS = (
    ("req/s", "req_per_s", "{:.2f}"),
    ("out tok/s", "output_tok_per_s", "{:.0f}"),
    ("prefix reuse", "prefix_reuse", "{:.3f}"),
    ("later no reuse", "later_turns_no_reuse", "{:.3f}"),
    ("TTFT p50 s", "ttft_p50_s", "{:.1f}"),
    ("TTFT p90 s", "ttft_p90_s", "{:.1f}"),
)


def print_spread(runs: list[dict[str, dict]], seeds: list[int]) -> None:
    """Mean (min-max) over the seeds' runs of every arm, and out tok/s against the baseline."""
    table = Table(title=f"mean (min-max) over seeds {','.join(map(str, seeds))}")
    table.add_column("arm", justify="left")
    for column, _, _ in SPREAD_COLUMNS:
        table.add_column(column, justify="right")
    table.add_column("tok/s x", justify="right")
    base = next(iter(runs[0]))
    for name in runs[0]:
        cells = []
        for _, key, form in SPREAD_COLUMNS:
            values = [run[name][key] for run in runs]
            low, mean, high = min(values), sum(values) / len(values), max(values)
            cells.append(f"{form.format(mean)} ({form.format(low)}-{form.format(high)})")
        ratios = [run[name]["output_tok_per_s"] / run[base]["output_tok_per_s"] for run in runs]
        cells.append(f"{sum(ratios) / len(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        table.add_row(name, *cells)
    Console(width=220).print(table)


def main() -> None:
    args = parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")] if args.seeds else [args.seed]
    runs = []
    for seed in seeds:
        args.seed = seed
        runs.append(asyncio.run(run(args)))
        print_table(runs[-1], args)
    if args.losses:
        for seed, arms_run in zip(seeds, runs, strict=True):
            rows = [(f"{name} seed {seed}", m, m["stats"], m["losses"], m["wall_s"])
                    for name, m in arms_run.items()]  # fmt: skip
            print_tables(rows, long_turn=20)
    results = runs[0]
    if len(runs) > 1:
        print_spread(runs, seeds)
    if args.plot is not None:
        paths = write_plots({name: m["timeline"] for name, m in results.items()}, args.plot)
        print("plots:", ", ".join(str(path) for path in paths))
    if args.json is not None:
        drop = ("records", "timeline", "losses")
        slim = [
            {name: {k: v for k, v in m.items() if k not in drop} for name, m in run.items()}
            for run in runs
        ]
        args.json.write_text(
            json.dumps(dict(zip(map(str, seeds), slim, strict=True)), indent=1, default=str)
        )


if __name__ == "__main__":
    main()
