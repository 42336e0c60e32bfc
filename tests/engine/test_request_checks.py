"""The engine's request checks (`request_checks.py`), as pure functions: each refusal names its
field, the pools' shortfall bounds a request, and the longest request is the last that fits."""

from __future__ import annotations

import pytest
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import FullLifeCycle
from kvfleet.kvstore.policies import PerRequest
from kvfleet.services.engine.core.request_checks import (
    RequestBounds,
    check_request,
    longest_request,
    pool_shortfall,
)
from kvfleet.services.engine.request.engine_request import GenerateCall, InvalidRequestError
from kvfleet.services.engine.request.sampling_params import SamplingParams

BOUNDS = RequestBounds(max_position=64, vocab_size=100, max_batch_size=4)


def fits(total: int) -> None:
    return None


def call(prompt=(1, 2, 3), max_tokens=8, num_samples=1, **sampling) -> GenerateCall:
    params = SamplingParams(max_tokens=max_tokens, **sampling)
    return GenerateCall("r", tuple(prompt), params, num_samples=num_samples)


@pytest.mark.parametrize(
    ("request_call", "field", "words"),
    [
        (call(prompt=()), "prompt", "empty prompt"),
        (call(prompt=range(64)), "prompt", "64 tokens leave no room"),
        (call(prompt=range(60), max_tokens=5), "max_tokens", "= 65 > model context 64"),
        (call(prompt=(5, 100, -1)), "prompt", "[100, -1] outside 0..99"),
        (call(num_samples=0), "num_samples", "0 not in 1..max_batch_size 4"),
        (call(num_samples=5), "num_samples", "5 not in 1..max_batch_size 4"),
        (call(grammar="root ::= x"), "sampling.grammar", "comes with its compiled form"),
    ],
    ids=["empty", "prompt-fills-context", "output-past-context", "vocab", "no-sample",
         "samples-past-batch", "grammar-uncompiled"],
)  # fmt: skip
def test_a_request_that_cannot_run_is_refused_naming_the_field(request_call, field, words):
    """A refusal without its field (or a request let through) is a 500 or a hung request."""
    with pytest.raises(InvalidRequestError) as caught:
        check_request(request_call, BOUNDS, fits)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_a_request_within_every_bound_passes():
    """A bound off by one refuses the longest request the model can serve."""
    check_request(call(prompt=range(60), max_tokens=4, num_samples=4), BOUNDS, fits)


def test_a_pool_shortfall_refuses_the_whole_request_by_its_total():
    """Checking the prompt alone admits a request whose output then cannot get pages."""
    seen = []

    def short(total: int) -> str:
        seen.append(total)
        return "9 pages > pool 'full' of 8"

    with pytest.raises(InvalidRequestError) as caught:
        check_request(call(prompt=range(10), max_tokens=20), BOUNDS, short)
    assert (caught.value.field, seen) == ("prompt", [30])
    assert str(caught.value) == "prompt: 30 tokens need 9 pages > pool 'full' of 8"


def test_a_request_id_already_running_is_refused():
    """Two requests under one id would share (and corrupt) one output queue."""
    with pytest.raises(InvalidRequestError) as caught:
        check_request(call(), BOUNDS, fits, running={"r"})
    assert caught.value.field == "request_id"
    check_request(call(), BOUNDS, fits, running={"other"})


def one_pool(usable: int):
    """A full-attention pool of `usable` pages of 4 tokens, chunks of 16 tokens."""
    store = KVStoreConfig(
        block_size=4,
        life_cycles=(FullLifeCycle("full"),),
        pool_pages={"full": usable + 1},
        reuse_policy=PerRequest(),
        checkpoint=False,
    )
    return lambda total: pool_shortfall(total, store, {"full": usable}, 16, checkpoint=False)


def test_a_full_pool_holds_a_request_of_its_pages_and_not_a_token_more():
    """A pool counted short refuses requests it holds; counted long, a request runs dry."""
    shortfall = one_pool(8)
    assert shortfall(32) is None
    assert shortfall(33) == "9 pages > pool 'full' of 8"


def test_the_longest_request_is_the_last_length_the_pools_hold():
    """A default max_tokens past it would be refused; short of it, output is cut needlessly."""
    assert longest_request(1000, one_pool(8)) == 32
    assert longest_request(20, one_pool(8)) == 20  # the model's context bounds it first
    assert longest_request(1000, lambda total: "short") == 0
