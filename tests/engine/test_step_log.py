"""The step log: every step's work, as the cost model counts it, and its measured seconds."""

from __future__ import annotations

import itertools
import json
import time

from engine_testkit import TEST_CONFIG, final, greedy, run_call, shared_compute, tokens_of
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.request.engine_request import GenerateCall


def test_each_step_logs_the_prompt_spans_and_decode_contexts_it_computed(tmp_path):
    """A log that drops a step or miscounts its spans would misprice the simulator's steps."""
    path = tmp_path / "steps.jsonl"
    config = TEST_CONFIG.with_changes(step_log_path=str(path))
    core = EngineCore(config, compute=shared_compute(TEST_CONFIG, "step-log")).start()
    begun = time.time()
    try:
        prompt = tuple(range(1, 101))
        first = run_call(core, GenerateCall("t1", prompt, greedy(8), "conv"))
        second_prompt = prompt + tuple(tokens_of(first)) + tuple(range(200, 230))
        second = run_call(core, GenerateCall("t2", second_prompt, greedy(8), "conv"))
    finally:
        core.stop()
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    computed = [
        len(prompt) - final(first).usage.cached_tokens,
        len(second_prompt) - final(second).usage.cached_tokens,
    ]
    assert final(second).usage.cached_tokens > 0  # the second turn reused the first's blocks
    spans = [tuple(span) for step in steps for span in step["prefill"]]
    assert sum(end - start for start, end in spans) == sum(computed)
    assert spans[0][0] == 0 and spans[-1][1] == len(second_prompt)
    # The first token comes from the prompt's last chunk; each later one is a decode step over
    # the context so far.
    decodes = [context for step in steps for context in step["decode"]]
    assert decodes == [*range(101, 108), *range(len(second_prompt) + 1, len(second_prompt) + 8)]
    assert all(step["s"] > 0 and begun - 1 <= step["t"] <= time.time() for step in steps)
    # each step's plan ran just before it, after the step before had ended
    assert all(step["plan"] > 0 for step in steps)
    for earlier, later in itertools.pairwise(steps):
        assert earlier["t"] + earlier["s"] <= later["t"] - later["plan"] + 1e-3
    assert all(step["host_in"] == 0 and step["disk_in"] == 0 for step in steps)
