"""When a token ends its sample and what the sample reports (`sample_finish.py`), as pure
functions: stop before length before a grammar's end, usage by whole blocks."""

from __future__ import annotations

import pytest
from kvfleet.services.engine.core.sample_finish import finish_reason, sample_usage, token_output
from kvfleet.services.engine.request.engine_request import GenerateCall, Usage
from kvfleet.services.engine.request.sampling_params import SamplingParams, TokenLogprob
from kvfleet.services.engine.request.sequence import Sequence

SAMPLING = SamplingParams(max_tokens=3, stop_token_ids=(9,))


def ends_in_stop_string(output) -> bool:
    return list(output[-2:]) == [4, 2]


@pytest.mark.parametrize(
    ("output", "grammar_ended", "reason"),
    [
        ([1], False, ""),
        ([1, 9], False, "stop"),  # a stop token
        ([4, 2], False, "stop"),  # the output ends in a stop string
        ([1, 2, 3], False, "length"),
        ([1, 9, 9], False, "stop"),  # a stop token at max_tokens is a stop
        ([1, 2], True, "stop"),  # the grammar ended
        ([1, 2, 3], True, "length"),  # at max_tokens the length wins over the grammar
    ],
)
def test_the_finish_reason_of_a_token(output, grammar_ended, reason):
    """A wrong precedence reports `length` for a stop (or goes on past max_tokens)."""
    got = finish_reason(output[-1], output, SAMPLING, ends_in_stop_string, grammar_ended)
    assert got == reason


def test_without_a_stop_check_only_tokens_and_length_end_a_sample():
    """A missing stop check must not be called (the caller without a tokenizer has none)."""
    assert finish_reason(2, [4, 2], SAMPLING, None) == ""


def sample(prompt_len=10, output=(5, 6, 7), cached=4) -> Sequence:
    call = GenerateCall("req", tuple(range(prompt_len)), SAMPLING)
    sequence = Sequence("req#1", call, 1, SAMPLING, None, arrived_at=100.0)
    sequence.output.extend(output)
    sequence.cached_tokens = cached
    sequence.first_token_at, sequence.itl_total = 100.5, 0.25
    return sequence


def test_usage_counts_whole_blocks_written_and_the_timings():
    """Counting a trailing partial block as written promises reuse that never matches."""
    usage = sample_usage(sample(), block_size=4)
    assert usage == Usage(
        prompt_tokens=10,
        cached_tokens=4,
        completion_tokens=3,
        ttft_seconds=0.5,
        mean_itl_seconds=0.125,  # two gaps between three tokens
        cache_write_tokens=4,  # blocks [0, 8) less the 4 cached
    )


def test_usage_of_a_sample_before_its_first_token():
    """A hand-off reports usage at the first token; nothing may divide by zero or go negative."""
    fresh = sample(output=(), cached=None)
    fresh.first_token_at, fresh.itl_total = None, 0.0
    usage = sample_usage(fresh, block_size=16)
    assert (usage.cached_tokens, usage.cache_write_tokens, usage.mean_itl_seconds) == (0, 0, 0.0)


def test_a_token_output_is_finished_exactly_when_it_has_a_reason():
    """An unfinished chunk with usage, or a finished one without, confuses every front."""
    logprob = TokenLogprob(7, -0.5)
    going = token_output(sample(), 7, logprob)
    assert (going.request_id, going.sample_index, going.token_ids) == ("req", 1, (7,))
    assert (going.finished, going.finish_reason, going.usage, going.logprobs) == (
        False, "", None, (logprob,),
    )  # fmt: skip
    usage = sample_usage(sample(), 4)
    done = token_output(sample(), 7, None, "length", usage)
    assert (done.finished, done.finish_reason, done.usage, done.logprobs) == (
        True, "length", usage, (),
    )  # fmt: skip
