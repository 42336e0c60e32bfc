"""Greedy, temperature, top-p, per-request seeds and stop tokens."""

from __future__ import annotations

import pytest
import torch
from kvfleet.services.engine.compute.sampling import (
    SampleFailure,
    make_generator,
    sample_batch,
    sample_token,
)
from kvfleet.services.engine.request.sampling_params import SamplingParams

LOGITS = torch.tensor([0.1, 2.0, 1.9, -1.0, 0.5, 1.0])


def _draws(params: SamplingParams, n: int = 30) -> list[int]:
    gen = make_generator(params)
    return [sample_token(LOGITS, params, gen) for _ in range(n)]


def test_greedy_is_argmax():
    """Temperature 0 must always pick the most likely token."""
    assert _draws(SamplingParams(temperature=0.0), 3) == [1, 1, 1]


def test_same_seed_same_tokens():
    """A seeded request must be reproducible, whatever else runs."""
    params = SamplingParams(temperature=1.0, seed=42)
    assert _draws(params) == _draws(params)


def test_different_seeds_differ():
    """Seeds that are ignored would make every sampled request identical."""
    assert _draws(SamplingParams(temperature=1.0, seed=1)) != _draws(
        SamplingParams(temperature=1.0, seed=2)
    )


def test_top_p_keeps_only_the_nucleus():
    """top_p must cut the tail: here only tokens 1 and 2 make up the first 60 %."""
    draws = set(_draws(SamplingParams(temperature=1.0, top_p=0.6, seed=0), 200))
    assert draws == {1, 2}


def test_tiny_top_p_is_greedy():
    """The nucleus always holds at least the most likely token."""
    assert set(_draws(SamplingParams(temperature=5.0, top_p=1e-6, seed=0))) == {1}


def test_batch_rows_use_their_own_params():
    """Each row must follow its own request, not the batch's first."""
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    params = [SamplingParams(), SamplingParams()]
    gens = [make_generator(p) for p in params]
    assert sample_batch(logits, params, gens) == [1, 4]


def test_stop_tokens():
    """A stop token must end the request."""
    params = SamplingParams(stop_token_ids=(7, 9))
    assert params.is_stop(9) and not params.is_stop(8)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"temperature": -0.5}, "temperature must be in"),
        ({"top_p": 0.0}, "top_p must be in"),
        ({"top_p": 1.5}, "top_p must be in"),
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ],
)
def test_invalid_sampling_values_are_refused(fields, message):
    """Bad sampling values must raise ValueError (the server maps it to 400)."""
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 1e-40},
        {"temperature": 1e-40, "top_p": 1e-40},
        {"temperature": 5e-324},
        {"temperature": 1.0, "top_p": 1e-40},
        {"temperature": 100.0, "top_p": 5e-324},
    ],
)
def test_extreme_accepted_values_never_make_nan(fields):
    """Extreme values that pass validation once made NaN probabilities and failed the batch."""
    params = SamplingParams(**fields, seed=0)
    for logits in (LOGITS, LOGITS * 3e37, torch.tensor([-3.4e38, 3.4e38, 3.3e38, 0.0])):
        token = sample_token(logits, params, make_generator(params))
        assert 0 <= token < logits.numel()
        if params.greedy or params.top_p < 1e-6:
            assert token == int(logits.argmax())


def test_a_row_with_nan_logits_fails_alone():
    """A NaN row must come back as that row's failure, with the other rows sampled."""
    logits = torch.stack([LOGITS, torch.full_like(LOGITS, float("nan")), LOGITS.flip(0)])
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=1), SamplingParams()]
    result = sample_batch(logits, params, [make_generator(p) for p in params])
    assert result[0] == 1 and result[2] == 4 and isinstance(result[1], SampleFailure)
