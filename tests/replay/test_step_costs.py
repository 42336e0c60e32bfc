"""bench/step_costs.py: logged steps priced by the cost model, and ranks' overlap on one chip."""

from __future__ import annotations

import importlib.util
import json
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
