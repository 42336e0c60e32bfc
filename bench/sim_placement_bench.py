"""Placement and re-homing arms on the fleet replay's shape, in the simulator.

The hardware fleet of docs/sim-vs-live.md (4 ranks x 2 slots of the 1b on one shared H100,
GPUs 50 % and GPUs + hosts 75 % of the working set, 12 sessions, 24 turns each, no think time)
loses reuse when timing pins its longest conversations on one rank. This runs that shape in
the simulator (`bench/gpu/sim_1b_h100_chip.yaml`) on sets of 12 sessions of one half
(`fleet_sizing.py`'s halves; each set sized from its own working set), over staggers, once per
arm (router options added to the simulator target, e.g. `placement=load` or
`rehome_below=0.7`), and prints reuse / oracle, later turns with no reuse, TTFT p90 and
output tok/s: mean and (min-max) over sets and staggers.

Run: nice -n 10 .venv/bin/python bench/sim_placement_bench.py --half tune [--sets 2]
     [--staggers 0.25,0.5,1,2,3] [--arms 'rehome_below=0;rehome_below=0.7'] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fleet_replay import SHARED
from fleet_sim import sim_target
from fleet_sizing import kv_bytes_per_token, report_half, size_fleet, tune_half
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
SIM = HERE / "gpu" / "sim_1b_h100_chip.yaml"
SET_SIZE, MAX_LEN, MAX_TURNS = 12, 131072, 24
METRICS = (("reuse / oracle", "{:.3f}"), ("later no reuse", "{:.1%}"), ("TTFT p90 s", "{:.2f}"),
           ("output tok/s", "{:.0f}"))  # fmt: skip


def session_sets(half: str, sets: int) -> list[tuple[list[Path], str]]:
    """Each set's files and its simulator target, sized as fleet_replay.py sizes the fleet."""
    pick = tune_half if half == "tune" else report_half
    files = pick(SHARED / "traces" / "claude_code_weka", SET_SIZE * sets, MAX_LEN)
    per_token = kv_bytes_per_token(16, 8, 64)  # the 1b preset
    out = []
    for i in range(sets):
        part = files[i * SET_SIZE : (i + 1) * SET_SIZE]
        sizing = size_fleet(part, MAX_LEN, MAX_TURNS, per_token, 4, 0.5, 0.75)
        # fleet_replay.py's fleet.json fields, so the simulator options are fleet_sim.py's
        fleet = {"ranks": 4, "slots": 2, "page_tokens": 16, "step_tokens": 8192,
                 "max_model_len": MAX_LEN, "gpu_gib_per_rank": sizing.gpu_gib_per_rank,
                 "host_gib_per_rank": sizing.host_gib_per_rank, "host_exclusive": True}  # fmt: skip
        out.append((part, sim_target(SIM, fleet, "defaults")))
    return out


def run_one(files: list[Path], target: str, stagger: float, arm: str, out: Path) -> tuple:
    """One replay; (reuse / oracle, later no reuse, TTFT p90, output tok/s)."""
    command = [sys.executable, "-m", "kvfleet.services.cli", "replay", *map(str, files),
               "--target", f"{target}&{arm}", "--json", str(out),
               "--sessions", str(len(files)), "--time-scale", "0", "--stagger", str(stagger),
               "--max-model-len", str(MAX_LEN), "--max-tokens", "64",
               "--max-turns", str(MAX_TURNS), "--no-progress"]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    m = json.loads(out.read_text())
    return (m["prefix_reuse"] / m["oracle_reuse"], m["later_turns_no_reuse"], m["ttft_p90_s"],
            m["output_tok_per_s"])  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--half", choices=("tune", "report"), default="tune")
    p.add_argument("--sets", type=int, default=2, help="sets of 12 sessions")
    p.add_argument("--staggers", default="0.25,0.5,1,2,3")
    p.add_argument(
        "--arms",
        default="rehome_below=0;rehome_below=0.7",
        help="';'-separated router options, each an arm (k=v&k=v)",
    )
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args()
    staggers = [float(s) for s in args.staggers.split(",")]
    arms = args.arms.split(";")
    sets = session_sets(args.half, args.sets)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        jobs = {(a, i, stagger): pool.submit(run_one, files, target, stagger, arm,
                                             Path(tmp) / f"{a}-{i}-{stagger}.json")
                for a, arm in enumerate(arms) for i, (files, target) in enumerate(sets)
                for stagger in staggers}  # fmt: skip
        results = {key: job.result() for key, job in jobs.items()}
    table = Table(title=f"{args.half} half: {args.sets} sets of {SET_SIZE} sessions x staggers "
                        f"{args.staggers} (mean, min-max)")  # fmt: skip
    table.add_column("arm")
    for name, _ in METRICS:
        table.add_column(name, justify="right")
    for a, arm in enumerate(arms):
        runs = [values for (b, _, _), values in results.items() if b == a]
        cells = []
        for column, (_, fmt) in enumerate(METRICS):
            values = [run[column] for run in runs]
            cells.append(f"{fmt.format(statistics.mean(values))} "
                         f"({fmt.format(min(values))}-{fmt.format(max(values))})")  # fmt: skip
        table.add_row(arm, *cells)
    Console(width=140).print(table)
    for (a, i, stagger), values in sorted(results.items()):
        print(f"{arms[a]} set {i} stagger {stagger}: " + ", ".join(
            fmt.format(v) for v, (_, fmt) in zip(values, METRICS, strict=True)))  # fmt: skip


if __name__ == "__main__":
    main()
