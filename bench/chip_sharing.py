"""How four ranks' steps share one GPU: the step logs replayed through the simulator's chip.

Reads the step logs of a fleet replay (one folder per run, `steps-engine<i>.jsonl[.xz]` of
its ranks, as bench/step_costs.py does) and replays each rank's busy runs (steps that follow
one another at once) through `SharedChip` on virtual time, the simulator's own rule: each
step's host work (the cost model's step overhead), then its chip time shared with the other
ranks' steps in flight. A run starts when its log says (or when the rank's previous run ends);
the cost model prices each step with the YAML's figures, the solo fit's, held fixed.

The one figure fitted is `hardware.chip_switch_ms`: the chip time a step costs extra when it
joins another rank's step on the chip. It is fitted on the shared decode steps (a decode step
that other ranks' steps overlap for at least 5 % of its cycle): their summed replayed cycles
must equal the logged ones, as a rank's time between tokens there is what the fleet's ITL and
output rate are made of. A per-step cost shows in a 5-15 ms decode step; in a 300 ms prefill
chunk it is lost in the model's own error. The table gives, per run folder, the fitted figure
and what the replay then says of the steps it was not fitted on: shared prefill cycles, each
rank's busy time, and the decode cycles' p90.

With `--slices MS:KERNELS...` it replays instead with the chip run by time slices
(`hardware.chip_slice_ms`, `chip_prefill_kernels`; no switch cost) and prints, per run folder
and per slice setting, the shared decode cycles' mean, p90 and p99, the shared prefill cycles'
mean and the busy time, logged and replayed, with the switch-cost fit beside them.

With `hardware.decode_overlap` in the YAML a decode step that follows a decode step of the
same sequences (each context one more) hides its host work behind the chip time of the step
before, as SimRank does (the engine's overlapped decode).

Run: .venv/bin/python bench/chip_sharing.py --sim bench/gpu/sim_1b_h100_chip.yaml LOG...
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from kvfleet.services.core.cost_model import CostModel
from kvfleet.services.replay.sim_chip import SharedChip
from kvfleet.services.replay.sim_clock import VirtualClock
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_sliced_chip import SlicedChip
from rich.console import Console
from rich.table import Table
from step_costs import (
    IDLE_S,
    SOLO_SHARE,
    covered_by_others,
    logs_and_costs,
    rank_spans,
    steps_of,
    work_of,
)

WARM_UP_S = 1.0  # a step this long that the model prices at under a tenth: capture, compile
SWITCH_RANGE_S = (0.0, 0.003)  # where the fit looks for the switch cost
FIT_ROUNDS = 14  # bisection halvings: 0.2 us


@dataclass
class Run:
    """One rank's steps that follow one another at once."""

    start: float
    steps: list[dict] = field(default_factory=list)

    @property
    def end(self) -> float:
        return self.steps[-1]["t"] + self.steps[-1]["s"]


def busy_runs(steps: list[dict], costs: CostModel) -> list[Run]:
    """A rank's runs, cut where it idled; warm-up steps are left out with their run."""
    runs: list[Run] = []
    current = None
    for step in sorted(steps, key=lambda step: step["t"]):
        if step["s"] > WARM_UP_S and costs.step_seconds(work_of(step)) < step["s"] / 10:
            current = None
            continue
        if current is None or step["t"] > current.end + IDLE_S:
            current = Run(step["t"])
            runs.append(current)
        current.steps.append(step)
    return runs


def shared_decodes(ranks: list[list[Run]]) -> dict[tuple[int, int, int], float]:
    """(rank, run, step) -> logged cycle of each decode step that other ranks' steps overlap."""
    spans = rank_spans([[s for run in runs for s in run.steps] for runs in ranks])
    out = {}
    for r, runs in enumerate(ranks):
        for i, run in enumerate(runs):
            for j, (step, after) in enumerate(zip(run.steps, run.steps[1:], strict=False)):
                if step["prefill"]:
                    continue
                a, b = step["t"], after["t"]
                if covered_by_others(spans, r, a, b)[0] >= SOLO_SHARE * (b - a):
                    out[r, i, j] = b - a
    return out


def looks_ahead(before: dict, step: dict) -> bool:
    """True when the engine planned `step` while `before` ran: both decode only, of the same
    sequences (each context one more)."""
    if before["prefill"] or step["prefill"]:
        return False
    return sorted(step["decode"]) == sorted(c + 1 for c in before["decode"])


async def replay(
    ranks: list[list[Run]], costs: CostModel, switch_s: float, slice_s: float = 0.0,
    kernels: int = 0, overlap: bool = False,
) -> dict:  # fmt: skip
    """(rank, run, step) -> replayed cycle; (rank, run) -> replayed run seconds. `slice_s`: the
    chip's time slices (0: processor sharing); `kernels`: a prefill step's chip time is that
    many kernels, which a slice does not cut (0: cut anywhere); `overlap`: decode steps hide
    their host work (`looks_ahead`)."""
    # virtual time from the first run: at epoch seconds a float cannot hold the chip's remainders
    base = min(run.start for runs in ranks for run in runs)
    clock = VirtualClock()
    chip = SlicedChip(clock, slice_s, switch_s=switch_s) if slice_s else SharedChip(clock, switch_s)
    out: dict = {}
    finished = asyncio.Event()
    left = [len(runs) for runs in ranks]

    def start_run(r: int, i: int) -> None:
        out[r, i] = clock.now()
        step(r, i, 0)

    chip_from: dict[tuple[int, int, int], float] = {}  # when each step's chip work began

    def step(r: int, i: int, j: int) -> None:
        began = clock.now()
        steps = ranks[r][i].steps
        duration = costs.step_seconds(work_of(steps[j]))
        host_s = costs.host_seconds(duration)  # as SimRank splits a step
        chip_s = duration - host_s
        if overlap and j and looks_ahead(steps[j - 1], steps[j]):
            host_s -= min(host_s, began - chip_from[r, i, j - 1])
        chip_from[r, i, j] = began + host_s
        kernel_s = chip_s / kernels if kernels and steps[j]["prefill"] else 0.0
        ended: Callable[[], None] = lambda: step_done(r, i, j, began)  # noqa: E731
        clock.call_at(began + host_s, lambda: chip.run(chip_s, ended, kernel_s))

    def step_done(r: int, i: int, j: int, began: float) -> None:
        out[r, i, j] = clock.now() - began
        if j + 1 < len(ranks[r][i].steps):
            step(r, i, j + 1)
            return
        out[r, i] = clock.now() - out[r, i]
        left[r] -= 1
        if i + 1 < len(ranks[r]):
            at = max(clock.now(), ranks[r][i + 1].start - base)
            clock.call_at(at, lambda: start_run(r, i + 1))
        elif not any(left):
            finished.set()

    for r, runs in enumerate(ranks):
        if runs:
            clock.call_at(runs[0].start - base, lambda r=r: start_run(r, 0))
    await finished.wait()
    clock.close()
    return out


def fit_switch(
    ranks: list[list[Run]], costs: CostModel, shared: dict, slice_s: float = 0.0, kernels: int = 0,
    overlap: bool = False,
) -> tuple[float, dict]:  # fmt: skip
    """The switch cost whose replay gives the shared decode steps their logged summed cycles."""
    logged = sum(shared.values())
    low, high = SWITCH_RANGE_S
    for _ in range(FIT_ROUNDS):
        middle = (low + high) / 2
        out = asyncio.run(replay(ranks, costs, middle, slice_s, kernels, overlap))
        if sum(out[key] for key in shared) > logged:
            high = middle
        else:
            low = middle
    switch_s = (low + high) / 2
    return switch_s, asyncio.run(replay(ranks, costs, switch_s, slice_s, kernels, overlap))


def measures(ranks: list[list[Run]], shared: dict, out: dict | None) -> list[float]:
    """Shared decode mean and p90 ms, shared prefill mean ms, busy s: logged or replayed."""
    prefills = [(r, i, j) for r, runs in enumerate(ranks) for i, run in enumerate(runs)
                for j, step in enumerate(run.steps[:-1]) if step["prefill"]]  # fmt: skip
    runs = [(r, i) for r, rank_runs in enumerate(ranks) for i in range(len(rank_runs))]
    if out is None:
        cycle = lambda r, i, j: ranks[r][i].steps[j + 1]["t"] - ranks[r][i].steps[j]["t"]  # noqa: E731
        decode = [shared[key] for key in shared]
        prefill = [cycle(*key) for key in prefills]
        busy = sum(ranks[r][i].end - ranks[r][i].start for r, i in runs)
    else:
        decode = [out[key] for key in shared]
        prefill = [out[key] for key in prefills]
        busy = sum(out[key] for key in runs)
    return [1e3 * statistics.mean(decode), 1e3 * float(np.percentile(decode, 90)),
            1e3 * statistics.mean(prefill), busy]  # fmt: skip


def spread(ranks: list[list[Run]], shared: dict, out: dict | None) -> list[float]:
    """Shared decode mean, p90 and p99 ms, shared prefill mean ms, busy s: logged or replayed."""
    mean, p90, prefill, busy = measures(ranks, shared, out)
    decode = list(shared.values()) if out is None else [out[key] for key in shared]
    return [mean, p90, 1e3 * float(np.percentile(decode, 99)), prefill, busy]


def slice_table(
    folders: dict[Path, list[Path]], costs: CostModel, slices: list[str], overlap: bool
) -> None:
    """Each folder replayed with time slices (MS:KERNELS), against the log and the switch fit."""
    table = Table(title="shared steps, logged / replayed (time slices: no switch cost)")
    for column in ("run", "chip", "decode mean ms", "decode p90 ms", "decode p99 ms",
                   "prefill mean ms", "busy s"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("run", "chip") else "right")
    for folder, logs in folders.items():
        ranks = [busy_runs(steps_of(log), costs) for log in sorted(logs)]
        shared = shared_decodes(ranks)
        logged = spread(ranks, shared, None)
        switch_s, fitted = fit_switch(ranks, costs, shared, overlap=overlap)
        models = [(f"switch {1e3 * switch_s:.2f} ms", fitted)]
        for setting in slices:
            slice_ms, kernels = setting.split(":")
            slice_s = float(slice_ms) / 1e3
            out = asyncio.run(replay(ranks, costs, 0.0, slice_s, int(kernels), overlap))
            models.append((f"slices {slice_ms} ms, {kernels} kernels", out))
        for name, out in models:
            table.add_row("/".join(folder.parts[-2:]), name,
                          *(f"{a:.1f} / {b:.1f}" for a, b in zip(logged, spread(ranks, shared, out),
                                                                  strict=True)))  # fmt: skip
    Console(width=160).print(table)


def main() -> None:
    def more(p: argparse.ArgumentParser) -> None:
        p.add_argument("--slices", nargs="+", metavar="MS:KERNELS", help="time-slice settings")

    args, costs = logs_and_costs(__doc__.split("\n")[0], more)
    overlap = load_sim_config(args.sim).hardware.decode_overlap
    folders: dict[Path, list[Path]] = {}
    for log in args.logs:
        folders.setdefault(log.parent, []).append(log)
    if args.slices:
        slice_table(folders, costs, args.slices, overlap)
        return
    table = Table(title="shared steps, logged / replayed with no switch cost / with the fit")
    for column in ("run", "shared decodes", "switch ms", "decode mean ms", "decode p90 ms",
                   "prefill mean ms", "busy s"):  # fmt: skip
        table.add_column(column, justify="left" if column == "run" else "right")
    fits = []
    for folder, logs in folders.items():
        ranks = [busy_runs(steps_of(log), costs) for log in sorted(logs)]
        shared = shared_decodes(ranks)
        switch_s, fitted = fit_switch(ranks, costs, shared, overlap=overlap)
        fits.append(1e3 * switch_s)
        rows = zip(measures(ranks, shared, None),
                   measures(ranks, shared, asyncio.run(replay(ranks, costs, 0.0, overlap=overlap))),
                   measures(ranks, shared, fitted), strict=True)  # fmt: skip
        table.add_row("/".join(folder.parts[-2:]), str(len(shared)), f"{1e3 * switch_s:.2f}",
                      *(" / ".join(f"{v:.1f}" for v in row) for row in rows))  # fmt: skip
    Console(width=140).print(table)
    print(f"switch cost: mean {statistics.mean(fits):.2f} ms, {min(fits):.2f}-{max(fits):.2f} "
          f"over {len(fits)} runs")  # fmt: skip


if __name__ == "__main__":
    main()
