"""The simulator's step log: the steps it ran, in the engine's step-log format."""

from __future__ import annotations

import itertools
import json

from sim_workloads import growing_conversation, replay_sim


async def test_the_step_log_holds_every_step_in_the_engines_format(tmp_path) -> None:
    """If this fails, bench/step_mix.py compares a fleet's steps with steps the simulator did
    not run: the log must hold every prompt token it computed and one decode per output token
    after the first, in the engine's fields (decode runs written as their single steps)."""
    conversation = growing_conversation("c", turns=3, first_blocks=20, step_blocks=4, block=64)
    options = {"ranks": 1, "slots": 1, "block_size": 64, "gpu_pages": 10_000}
    result, _ = await replay_sim([conversation], 1, step_log=str(tmp_path), **options)
    lines = (tmp_path / "steps-rank-0.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines]
    assert {key for step in steps for key in step} == {"t", "s", "prefill", "decode",
                                                       "host_in", "disk_in"}  # fmt: skip
    records = result.records
    computed = sum(r.prompt_tokens - r.reused_tokens for r in records)
    assert sum(b - a for step in steps for a, b in step["prefill"]) == computed
    assert sum(len(step["decode"]) for step in steps) == sum(r.output_tokens - 1 for r in records)
    # one rank: each step starts when the one before ends (t and s are rounded to 1 us)
    assert all(b["t"] >= a["t"] + a["s"] - 2e-6 for a, b in itertools.pairwise(steps))
