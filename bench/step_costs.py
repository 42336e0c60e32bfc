"""Every logged engine step priced by a simulator's cost model, against its measured seconds.

Reads step logs (`kvfleet engine --step-log`, services/engine/core/step_log.py; the fleet
replay keeps one per rank as `steps-engine<i>.jsonl`) and a simulator YAML (model shape and
hardware figures), prices each step with `CostModel.step_seconds` and prints, per kind of step
and size, how many there were, the measured and modelled mean and the ratio of their sums.
Ranks that share one GPU (the fleet replay's four) overlap their steps: the table's last lines
give the ranks' steps in flight on average and the chip time the model asks for against the
wall time the logs span (over 1: the model is too slow for what the chip did; well under 1 on
a saturated fleet: too fast).

A shared chip's steps measure the sharing as much as the step. The second table keeps the
steps a rank ran alone (no other rank's step for 95 % of it) and followed at once with its next
step, and compares their cycle (start to the rank's next start: the step plus its host work)
with the model. The last line fits those cycles by least squares: the model's linear term as
is, and a step overhead, a cost per prefill chunk and factors on its attention and decode KV
terms (what `step_overhead_ms`, `prefill_chunk_ms`, `attention_tflops` and
`decode_kv_read_tb_s` would become).

Run: .venv/bin/python bench/step_costs.py --sim bench/gpu/sim_1b_h100_chip.yaml LOG...
     [--page-size 16] [--kv-dtype-bytes 1]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import lzma
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from kvfleet.services.core.cost_model import CostModel, StepWork
from kvfleet.services.replay.sim_config import load_sim_config
from rich.console import Console
from rich.table import Table

CONTEXT_EDGES = (16_384, 65_536)  # decode buckets by the batch's longest context
WARM_UP_S = 5.0  # longer steps are a rank's start (graph capture, first compile): left out
SOLO_SHARE = 0.05  # a step is solo when other ranks' steps cover under this share of its cycle
IDLE_S = 0.05  # a rank idle longer than this after a step: the step has no cycle


@dataclass
class Bucket:
    steps: int = 0
    measured_s: float = 0.0
    model_s: float = 0.0


def read_log(path: Path) -> str:
    """A step log's text; `.xz`: compressed, as the kept draws are."""
    return lzma.decompress(path.read_bytes()).decode() if path.suffix == ".xz" else path.read_text()


def steps_of(path: Path) -> list[dict]:
    """Every step one log holds, in order."""
    return [json.loads(line) for line in read_log(path).splitlines() if line.strip()]


def load_steps(paths: list[Path]) -> list[tuple[str, dict]]:
    """(log name, step) for every line of every log."""
    return [(path.name.split(".")[0], step) for path in paths for step in steps_of(path)]


def work_of(step: dict) -> StepWork:
    spans = tuple((int(a), int(b)) for a, b in step["prefill"])
    return StepWork(spans, tuple(step["decode"]), step["host_in"], step["disk_in"])


def bucket_of(step: dict) -> str:
    """A step's kind and size: prefill by its new tokens, decode by batch and longest context."""
    if step["prefill"]:
        tokens = sum(b - a for a, b in step["prefill"])
        return f"prefill {'<= 2048' if tokens <= 2048 else '> 2048'} new tokens"
    longest = max(step["decode"])
    size = next((f"<= {edge // 1024}k" for edge in CONTEXT_EDGES if longest <= edge), "> 64k")
    return f"decode x{len(step['decode'])}, context {size}"


def steps_in_flight(steps: list[tuple[str, dict]]) -> tuple[float, float]:
    """(mean steps running at once while any runs, wall seconds the logs span)."""
    edges = sorted([(s["t"], 1) for _, s in steps] + [(s["t"] + s["s"], -1) for _, s in steps])
    running, last, busy, weighted = 0, edges[0][0], 0.0, 0.0
    for time, change in edges:
        if running:
            busy += time - last
            weighted += running * (time - last)
        running, last = running + change, time
    return (weighted / busy if busy else 0.0), edges[-1][0] - edges[0][0]


Span = tuple[float, float, bool]  # a logged step: (start, end, computes a prefill chunk)


def rank_spans(ranks: list[list[dict]]) -> list[list[Span]]:
    """Each rank's logged steps as spans in start order."""
    return [sorted((s["t"], s["t"] + s["s"], bool(s.get("prefill"))) for s in steps)
            for steps in ranks]  # fmt: skip


def covered_by_others(
    spans: list[list[Span]], rank: int, start: float, end: float
) -> tuple[float, bool]:
    """Seconds of [start, end) the other ranks' steps cover (summed over ranks), and whether
    one of those overlapping computes a prefill chunk."""
    total, prefill = 0.0, False
    for other, other_spans in enumerate(spans):
        if other == rank:
            continue
        i = max(0, bisect.bisect_left(other_spans, (start,)) - 1)
        while i < len(other_spans) and other_spans[i][0] < end:
            first, last, is_prefill = other_spans[i]
            overlap = min(end, last) - max(start, first)
            if overlap > 0:
                total += overlap
                prefill = prefill or is_prefill
            i += 1
    return total, prefill


def solo_cycles(steps: list[tuple[str, dict]]) -> list[tuple[dict, float]]:
    """(step, cycle seconds) of the steps a rank ran alone and followed at once."""
    per_rank: dict[str, list[dict]] = {}
    for name, step in steps:
        per_rank.setdefault(name, []).append(step)
    ranks = [sorted(rank_steps, key=lambda step: step["t"]) for rank_steps in per_rank.values()]
    spans = rank_spans(ranks)
    out = []
    for r, rank_steps in enumerate(ranks):
        for step, after in itertools.pairwise(rank_steps):
            cycle = after["t"] - step["t"]
            if step["s"] > WARM_UP_S or cycle > step["s"] + IDLE_S:
                continue
            if covered_by_others(spans, r, step["t"], after["t"])[0] < SOLO_SHARE * cycle:
                out.append((step, cycle))
    return out


def fit_solo(costs: CostModel, solo: list[tuple[dict, float]]) -> str:
    """Least squares of the solo cycles over the model's terms (linear taken as is)."""
    rows, left = [], []
    for step, cycle in solo:
        work = work_of(step)
        linear = max(costs.weights_read_s, work.computed_tokens * costs.linear_s_per_token)
        pairs = sum(costs.attention_pairs(a, b) for a, b in work.prefill_spans)
        rows.append([1.0, len(work.prefill_spans), pairs * costs.attention_s_per_pair,
                     costs.decode_kv_seconds(work.decode_contexts)])  # fmt: skip
        left.append(cycle - linear - work.host_pages_in * costs.host_copy_s_per_page)
    (overhead, chunk, attention, kv), *_ = np.linalg.lstsq(np.array(rows), np.array(left))
    return (f"fit of {len(solo)} solo cycles: step overhead {1e3 * overhead:.1f} ms, "
            f"prefill chunk {1e3 * chunk:.1f} ms, attention x{attention:.2f}, "
            f"decode KV x{kv:.2f}")  # fmt: skip


def buckets_of(rows: list[tuple[dict, float]], costs: CostModel) -> dict[str, Bucket]:
    """Per kind and size of step (and "all"): count, measured and modelled seconds."""
    buckets: dict[str, Bucket] = {}
    total = Bucket()
    for step, measured in rows:
        modelled = costs.step_seconds(work_of(step))
        for bucket in (buckets.setdefault(bucket_of(step), Bucket()), total):
            bucket.steps += 1
            bucket.measured_s += measured
            bucket.model_s += modelled
    return {**buckets, "all": total}


def bucket_table(title: str, buckets: dict[str, Bucket]) -> Table:
    """The buckets' measured and modelled means and the ratio of their sums, "all" last."""
    table = Table(title=title)
    for column in ("steps", "kind and size", "measured ms", "model ms", "measured / model"):
        table.add_column(column, justify="left" if column == "kind and size" else "right")
    for name, b in sorted(buckets.items(), key=lambda item: (item[0] == "all", item[0])):
        measured_ms, model_ms = 1e3 * b.measured_s / b.steps, 1e3 * b.model_s / b.steps
        table.add_row(str(b.steps), name, f"{measured_ms:.2f}", f"{model_ms:.2f}",
                      f"{b.measured_s / b.model_s:.2f}")  # fmt: skip
    return table


def logs_and_costs(
    description: str, more: Callable[[argparse.ArgumentParser], None] | None = None
) -> tuple[argparse.Namespace, CostModel]:
    """The command line of a tool that prices step logs (LOG... --sim YAML [--page-size]
    [--kv-dtype-bytes], and what `more` adds): its arguments and the simulator's cost model."""
    p = argparse.ArgumentParser(description=description)
    if more is not None:
        more(p)
    p.add_argument("logs", type=Path, nargs="+")
    p.add_argument("--sim", type=Path, required=True, help="simulator YAML (model, hardware)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--kv-dtype-bytes", type=int, default=None, help="1: an fp8 cache")
    args = p.parse_args()
    sim = load_sim_config(args.sim)
    costs = CostModel.from_figures(sim.model, sim.hardware, args.page_size, args.kv_dtype_bytes)
    return args, costs


def main() -> None:
    args, costs = logs_and_costs(__doc__.split("\n")[0])
    steps = load_steps(args.logs)
    if not steps:
        raise SystemExit("no steps in the logs")
    console = Console(width=120)
    every = buckets_of([(step, step["s"]) for _, step in steps], costs)
    console.print(bucket_table(f"{len(steps)} steps of {len(args.logs)} logs, priced by "
                               f"{args.sim.name}", every))  # fmt: skip
    modelled = every["all"].model_s
    in_flight, wall = steps_in_flight(steps)
    chip = modelled - len(steps) * costs.step_overhead_s
    console.print(f"steps in flight while any runs: {in_flight:.2f}; the logs span {wall:.1f} s; "
                  f"the model's chip time (less each step's host overhead) {chip:.1f} s = "
                  f"{chip / wall:.2f} of it")  # fmt: skip
    solo = solo_cycles(steps)
    if solo:
        console.print(bucket_table("solo steps: cycle (the step and its host work) against "
                                   "the model", buckets_of(solo, costs)))  # fmt: skip
        console.print(fit_solo(costs, solo))


if __name__ == "__main__":
    main()
