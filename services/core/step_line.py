"""One line of a step log: a step's start, seconds and work (`StepWork`), as JSON.

The engine's step log (services/engine/core/step_log.py) and the simulator's
(services/replay/sim_step_log.py) write the same lines, so one reader (bench/step_costs.py,
bench/step_mix.py) compares a fleet's steps with the simulator's.
"""

from __future__ import annotations

import json

from .cost_model import StepWork


def step_line(
    started: float,
    seconds: float,
    work: StepWork,
    disk_written: int | None = None,
    queue: tuple[int, bool] | None = None,
    planned: float | None = None,
) -> str:
    """`t` (start), `s` (seconds), `prefill` spans, `decode` contexts, `host_in`, `disk_in`,
    and where the writer counts them, `disk_out`: pages written to the disk tier since the
    step before (on the core thread, before this step: a pause as an onboarding is), `queue`
    as `waiting` (requests left waiting at the rank by this step's plan) and `ahead` (the step
    was planned while the one before ran on the device), and `plan`: the seconds its plan took,
    just before `t` (a pause of the core thread, as the onboarding)."""
    line = {"t": round(started, 6), "s": round(seconds, 6),
            "prefill": [list(span) for span in work.prefill_spans],
            "decode": list(work.decode_contexts), "host_in": work.host_pages_in,
            "disk_in": work.disk_pages_in}  # fmt: skip
    if disk_written is not None:
        line["disk_out"] = disk_written
    if queue is not None:
        line["waiting"], line["ahead"] = queue
    if planned is not None:
        line["plan"] = round(planned, 6)
    return json.dumps(line, separators=(",", ":")) + "\n"
