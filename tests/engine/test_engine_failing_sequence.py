"""One request whose sampling fails inside a step fails alone; the batch's others go on."""

from __future__ import annotations

import pytest
from engine_testkit import (
    TEST_CONFIG,
    final,
    greedy,
    make_core,
    pages_in_use,
    run_together,
    tokens_of,
)
from kvfleet.services.engine.compute.sampling import SamplingParams
from kvfleet.services.engine.request.engine_request import GenerateCall, SequenceFailedError

PER_REQUEST = TEST_CONFIG.with_changes(reuse_policy="per_request")


def poisoned(max_tokens: int) -> SamplingParams:
    """Params with a NaN temperature, as if a bug let one past validation."""
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=3)
    object.__setattr__(params, "temperature", float("nan"))
    return params


def good_calls() -> list[GenerateCall]:
    tiny_temperature = SamplingParams(temperature=1e-40, top_p=1e-40, max_tokens=8, seed=1)
    return [
        GenerateCall("g0", tuple(range(3, 23)), greedy(8)),
        GenerateCall("g1", tuple(range(40, 58)), greedy(8)),
        GenerateCall("tiny", tuple(range(70, 85)), tiny_temperature),
    ]


@pytest.fixture
def core():
    core = make_core(PER_REQUEST)
    yield core
    core.check_integrity()
    core.stop()


def test_a_failing_sequence_fails_alone_and_the_others_match_a_clean_run(core):
    """A NaN in one row once failed every request of the batch (and the router took the rank
    for dead); now only its request gets an error and the others' greedy tokens are unchanged."""
    clean = run_together(core, good_calls())
    mixed = run_together(core, [*good_calls()[:2], GenerateCall("bad", (9, 8, 7), poisoned(8)),
                                good_calls()[2]])  # fmt: skip
    assert isinstance(mixed["bad"], SequenceFailedError)
    for call in good_calls():
        assert tokens_of(mixed[call.request_id]) == tokens_of(clean[call.request_id])
        assert final(mixed[call.request_id]).finish_reason == "length"
    assert pages_in_use(core) == {"full": 0, "window": 0}


def test_a_tiny_temperature_is_greedy(core):
    """temperature=1e-40 once made NaN probabilities; it must pick what greedy picks."""
    clean = run_together(core, good_calls())
    plain = run_together(core, [GenerateCall("ref", tuple(range(70, 85)), greedy(8))])
    assert tokens_of(clean["tiny"]) == tokens_of(plain["ref"])


def test_non_finite_logits_fail_their_row_alone_on_the_greedy_device_path(core):
    """An all-greedy batch takes its argmax on the device; a row whose logits hold NaN must fail
    there too, not come back as whatever index argmax picks."""
    clean = run_together(core, good_calls()[:2])
    prompt = (9, 8, 7)

    def poison_rows(_module, _inputs, logits):
        # The row of the request whose prompt is `prompt`: its first step's last logits row is
        # the batch's last (it was submitted last); later steps see it only if it survived.
        if logits.shape[0] == 3:
            logits = logits.clone()
            logits[-1, 5] = float("nan")
        return logits

    hook = core.compute.model.register_forward_hook(poison_rows)
    try:
        mixed = run_together(core, [*good_calls()[:2], GenerateCall("bad", prompt, greedy(8))])
    finally:
        hook.remove()
    assert isinstance(mixed["bad"], SequenceFailedError)
    for call in good_calls()[:2]:
        assert tokens_of(mixed[call.request_id]) == tokens_of(clean[call.request_id])
