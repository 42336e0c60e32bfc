"""The engine core: finished and cancelled requests leak no pages; samples, stops, pressure."""

from __future__ import annotations

import pytest
from engine_testkit import (
    TEST_CONFIG,
    final,
    greedy,
    make_core,
    pages_in_use,
    run_call,
    tokens_of,
    wait_until,
)
from kvfleet.services.engine.compute.sampling import SamplingParams
from kvfleet.services.engine.request.engine_request import GenerateCall, InvalidRequestError

PER_REQUEST = TEST_CONFIG.with_changes(reuse_policy="per_request")


@pytest.fixture
def core():
    core = make_core(PER_REQUEST)
    yield core
    core.check_integrity()
    core.stop()


def test_finished_and_cancelled_requests_leave_no_pages_held(core):
    """A cancelled or finished request that keeps page refs would leak the pool dry."""
    handles = [
        core.submit(GenerateCall(f"r{i}", tuple(range(1, 90 + i)), greedy(40), f"c{i}"))
        for i in range(4)
    ]
    assert handles[0].get(10) is not None  # running
    handles[0].cancel()
    handles[1].cancel()
    for handle in handles[2:]:
        list(handle.outputs(30))
    wait_until(lambda: core.load().running == 0 and core.load().queued == 0)
    core.check_integrity()
    assert pages_in_use(core) == {"full": 0, "window": 0}


def test_child_samples_reuse_the_parent_prompt_and_follow_their_seeds(core):
    """Children that recompute the prompt or share one generator break `1 + children` slots."""
    sampling = SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=6)
    outputs = run_call(core, GenerateCall("r", tuple(range(1, 100)), sampling, None, 3))
    assert [final(outputs, i).usage.cached_tokens for i in range(3)] == [0, 96, 96]
    again = run_call(core, GenerateCall("r2", tuple(range(1, 100)), sampling, None, 3))
    assert [tokens_of(again, i) for i in range(3)] == [tokens_of(outputs, i) for i in range(3)]


def test_stop_token_ends_the_sample_with_reason_stop(core):
    """A stop token that does not end the sample would run to max_tokens."""
    first = tokens_of(run_call(core, GenerateCall("a", (5, 6, 7), greedy(4))))[0]
    outputs = run_call(core, GenerateCall("b", (5, 6, 7), greedy(4, stop_token_ids=(first,))))
    assert (tokens_of(outputs), final(outputs).finish_reason) == ([first], "stop")


def test_preemption_under_page_pressure_keeps_greedy_output(core):
    """Preempted sequences that resume from the wrong tokens would change their output."""
    small = TEST_CONFIG.with_changes(reuse_policy="per_request", kv_pages=30)
    tight = make_core(small, storage="tight")
    try:
        calls = [GenerateCall(f"p{i}", tuple(range(i + 1, i + 120)), greedy(60)) for i in range(3)]
        handles = [tight.submit(call) for call in calls]
        outputs = [list(h.outputs(60)) for h in handles]
        assert tight.scheduler.preemptions > 0
        for call, output in zip(calls, outputs, strict=True):
            assert tokens_of(output) == tokens_of(run_call(core, call))
        tight.check_integrity()
    finally:
        tight.stop()


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (GenerateCall("x", (), greedy()), "prompt"),
        (GenerateCall("x", tuple([1] * 4096), greedy()), "prompt"),
        (GenerateCall("x", (1, 2), greedy(4095)), "max_tokens"),
        (GenerateCall("x", (1, 999), greedy()), "prompt"),
        (GenerateCall("x", (1, 2), greedy(), None, 5), "num_samples"),
    ],
)
def test_bad_input_names_the_field(core, call, field):
    """An error that does not name the field leaves the client guessing."""
    with pytest.raises(InvalidRequestError) as error:
        core.submit(call)
    assert error.value.field == field and str(error.value).startswith(f"{field}: ")


def test_retained_turns_hold_pages_and_are_reported(core):
    """Retention that the load does not report hides the working set from autoscaling."""
    retaining = make_core(TEST_CONFIG, storage="retain")
    try:
        run_call(retaining, GenerateCall("t1", tuple(range(1, 100)), greedy(2), "conv"))
        wait_until(lambda: retaining.load().retained_pages > 0)
        assert retaining.load().retained_pages == sum(pages_in_use(retaining).values())
        retaining.check_integrity()
    finally:
        retaining.stop()


def test_releases_and_steps_are_counted_on_metrics():
    """The fleet benches read why a turn lost its prefix and how long steps took from these:
    the release counter must follow the scheduler's releases, and both step kinds are timed."""
    small = TEST_CONFIG.with_changes(reuse_policy="per_conversation", kv_pages=40)
    tight = make_core(small, storage="released")
    try:
        for i in range(6):
            run_call(tight, GenerateCall(f"q{i}", tuple(range(i + 1, i + 300)), greedy(4), f"c{i}"))
        wait_until(lambda: tight.load().running == 0)
        released = tight.scheduler.retained.released
        counted = tight.metrics.registry.get_sample_value(
            "kvfleet_engine_retained_conversations_released_total"
        )
        assert released > 0
        assert counted == released
        steps = {
            kind: tight.metrics.registry.get_sample_value(
                "kvfleet_engine_step_seconds_count", {"kind": kind}
            )
            for kind in ("prefill", "decode")
        }
        assert steps["prefill"] >= 6 and steps["decode"] >= 6 * 3, steps
    finally:
        tight.stop()
