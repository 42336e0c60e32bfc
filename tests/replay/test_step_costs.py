"""bench/step_costs.py: logged steps priced by the cost model, and ranks' overlap on one chip."""

from __future__ import annotations

import importlib.util
import json
import lzma
import sys
from pathlib import Path

from kvfleet.services.core.cost_model import CostModel
from kvfleet.services.replay.sim_config import load_sim_config

BENCH = Path(__file__).resolve().parents[2] / "bench"
spec = importlib.util.spec_from_file_location("step_costs", BENCH / "step_costs.py")
step_costs = importlib.util.module_from_spec(spec)
sys.modules["step_costs"] = step_costs  # its dataclasses look their module up
spec.loader.exec_module(step_costs)


def write_log(path: Path, steps: list[dict]) -> Path:
    path.write_text("".join(json.dumps(step) + "\n" for step in steps))
    return path


def step(t: float, s: float, prefill=(), decode=()) -> dict:
    return {"t": t, "s": s, "prefill": [list(p) for p in prefill], "decode": list(decode),
            "host_in": 0, "disk_in": 0}  # fmt: skip


def test_two_ranks_overlapping_half_the_time_run_one_and_a_half_steps_at_once(tmp_path):
    """Counting idle gaps or one rank's steps only would misread how the chip was shared."""
    a = write_log(tmp_path / "steps-engine0.jsonl", [step(0.0, 2.0, decode=(100,))])
    b = write_log(tmp_path / "steps-engine1.jsonl", [step(1.0, 2.0, decode=(100,)),
                                                    step(5.0, 1.0, decode=(100,))])  # fmt: skip
    in_flight, wall = step_costs.steps_in_flight(step_costs.load_steps([a, b]))
    # busy 0-3 (1 to 2 with both) and 5-6: 5 s of steps over 4 busy seconds
    assert (round(in_flight, 6), wall) == (1.25, 6.0)


def test_a_logged_step_is_priced_as_the_simulator_prices_that_work(tmp_path):
    """The bench must price the very StepWork the sim backend would have slept for."""
    sim = load_sim_config(BENCH / "sim_tiny_cpu.yaml")
    costs = CostModel.from_figures(sim.model, sim.hardware, 16)
    logged = step(0.0, 0.01, prefill=((32, 96),), decode=(500, 700))
    work = step_costs.work_of(logged)
    assert work.prefill_spans == ((32, 96),) and work.decode_contexts == (500, 700)
    assert costs.step_seconds(work) > costs.step_seconds(step_costs.work_of(step(0, 0.01)))
    assert step_costs.bucket_of(logged) == "prefill <= 2048 new tokens"
    assert step_costs.bucket_of(step(0, 0.01, decode=(500, 70_000))) == "decode x2, context > 64k"


def test_solo_cycles_keep_steps_run_alone_and_followed_at_once(tmp_path):
    """A shared step's time measures the sharing; a step before an idle gap has no cycle."""
    a = write_log(tmp_path / "steps-engine0.jsonl", [
        step(0.0, 0.010, decode=(100,)),  # alone, next at 0.012: cycle 12 ms
        step(0.012, 0.010, decode=(100,)),  # engine1 runs beside it: shared
        step(0.025, 0.010, decode=(100,)),  # idle 1 s after it: no cycle
        step(1.035, 0.010, decode=(100,)),  # the last: no next step
    ])  # fmt: skip
    b = write_log(tmp_path / "steps-engine1.jsonl", [step(0.015, 0.005, decode=(100,))])
    solo = step_costs.solo_cycles(step_costs.load_steps([a, b]))
    assert [(s["t"], round(cycle, 6)) for s, cycle in solo] == [(0.0, 0.012)]


def test_the_fit_recovers_a_chunk_cost_the_model_lacks(tmp_path):
    """Cycles made by the model plus 30 ms per prefill chunk and 1 ms less overhead: the fit
    must name those, and read the log compressed as the kept draws are."""
    sim = load_sim_config(BENCH / "sim_tiny_cpu.yaml")
    costs = CostModel.from_figures(sim.model, sim.hardware, 16)
    steps, t = [], 0.0
    for i in range(60):
        prefill = ((0, 512 * (1 + i % 7)),) if i % 3 == 0 else ()
        decode = (1_000 + 900 * (i % 5),) * (1 + i % 2)
        logged = step(t, 0.0, prefill=prefill, decode=decode)
        cycle = costs.step_seconds(step_costs.work_of(logged)) + 0.030 * len(prefill) - 0.001
        logged["s"] = cycle
        steps.append(logged)
        t += cycle
    path = tmp_path / "steps-engine0.jsonl.xz"
    path.write_bytes(lzma.compress("".join(json.dumps(s) + "\n" for s in steps).encode()))
    solo = step_costs.solo_cycles(step_costs.load_steps([path]))
    assert len(solo) == 59
    overhead_ms = 1e3 * costs.step_overhead_s - 1
    assert step_costs.fit_solo(costs, solo) == (
        f"fit of 59 solo cycles: step overhead {overhead_ms:.1f} ms, prefill chunk 30.0 ms, "
        "attention x1.00, decode KV x1.00"
    )
