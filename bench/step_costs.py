"""Every logged engine step priced by a simulator's cost model, against its measured seconds.

Reads step logs (`kvfleet engine --step-log`, services/engine/core/step_log.py; the fleet
replay keeps one per rank as `steps-engine<i>.jsonl`) and a simulator YAML (model shape and
hardware figures), prices each step with `CostModel.step_seconds` and prints, per kind of step
and size, how many there were, the measured and modelled mean and the ratio of their sums.
Ranks that share one GPU (the fleet replay's four) overlap their steps: the table's last lines
give the ranks' steps in flight on average and the chip time the model asks for against the
wall time the logs span (over 1: the model is too slow for what the chip did; well under 1 on
a saturated fleet: too fast).

Run: .venv/bin/python bench/step_costs.py --sim bench/gpu/sim_1b_h100_chip.yaml LOG...
     [--page-size 16] [--kv-dtype-bytes 1]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from kvfleet.services.core.cost_model import CostModel, StepWork
from kvfleet.services.replay.sim_config import load_sim_config
from rich.console import Console
from rich.table import Table

CONTEXT_EDGES = (16_384, 65_536)  # decode buckets by the batch's longest context


@dataclass
class Bucket:
    steps: int = 0
    measured_s: float = 0.0
    model_s: float = 0.0


def load_steps(paths: list[Path]) -> list[tuple[str, dict]]:
    """(log name, step) for every line of every log."""
    return [(path.stem, json.loads(line)) for path in paths
            for line in path.read_text().splitlines() if line.strip()]  # fmt: skip


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("logs", type=Path, nargs="+")
    p.add_argument("--sim", type=Path, required=True, help="simulator YAML (model, hardware)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--kv-dtype-bytes", type=int, default=None, help="1: an fp8 cache")
    args = p.parse_args()
    sim = load_sim_config(args.sim)
    costs = CostModel.from_figures(sim.model, sim.hardware, args.page_size, args.kv_dtype_bytes)
    steps = load_steps(args.logs)
    if not steps:
        raise SystemExit("no steps in the logs")
    buckets: dict[str, Bucket] = {}
    for _, step in steps:
        bucket = buckets.setdefault(bucket_of(step), Bucket())
        modelled = costs.step_seconds(work_of(step))
        bucket.steps += 1
        bucket.measured_s += step["s"]
        bucket.model_s += modelled
    table = Table(title=f"{len(steps)} steps of {len(args.logs)} logs, priced by {args.sim.name}")
    for column in ("steps", "kind and size", "measured ms", "model ms", "measured / model"):
        table.add_column(column, justify="left" if column == "kind and size" else "right")
    for name, b in sorted(buckets.items()):
        measured_ms, model_ms = 1e3 * b.measured_s / b.steps, 1e3 * b.model_s / b.steps
        table.add_row(str(b.steps), name, f"{measured_ms:.2f}", f"{model_ms:.2f}",
                      f"{b.measured_s / b.model_s:.2f}")  # fmt: skip
    measured = sum(b.measured_s for b in buckets.values())
    modelled = sum(b.model_s for b in buckets.values())
    table.add_row(str(len(steps)), "all", f"{1e3 * measured / len(steps):.2f}",
                  f"{1e3 * modelled / len(steps):.2f}", f"{measured / modelled:.2f}")  # fmt: skip
    console = Console(width=120)
    console.print(table)
    in_flight, wall = steps_in_flight(steps)
    chip = modelled - len(steps) * costs.step_overhead_s
    console.print(f"steps in flight while any runs: {in_flight:.2f}; the logs span {wall:.1f} s; "
                  f"the model's chip time (less each step's host overhead) {chip:.1f} s = "
                  f"{chip / wall:.2f} of it")  # fmt: skip


if __name__ == "__main__":
    main()
