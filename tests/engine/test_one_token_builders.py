"""What a decode step builds per sequence without the frozen dataclasses' per-field setattr
(`ScheduledChunk.one_token` over `Sequence.token_at`, `SampleOutput.one_token`) equals what
their constructors build, and stays frozen."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.services.engine.compute.sampling import SamplingParams
from kvfleet.services.engine.request.engine_request import GenerateCall, SampleOutput
from kvfleet.services.engine.request.scheduled_chunk import ScheduledChunk
from kvfleet.services.engine.request.sequence import Sequence


def sequence_of(prompt: list[int], output: list[int]) -> Sequence:
    params = SamplingParams(max_tokens=64)
    call = GenerateCall("r", tuple(prompt), params, "c")
    return Sequence("r", call, 0, params, None, 0.0, output=list(output))


@settings(max_examples=100, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 1000), min_size=1, max_size=12),
    output=st.lists(st.integers(0, 1000), max_size=12),
    data=st.data(),
)
def test_one_token_chunk_equals_the_dataclass(prompt, output, data):
    sequence = sequence_of(prompt, output)
    start = data.draw(st.integers(0, sequence.num_tokens - 1))
    pages = {"full": (3, 4)}
    fast = ScheduledChunk.one_token(sequence, start, sequence.token_at(start), pages)
    built = ScheduledChunk(sequence, start, tuple(sequence.tokens(start, start + 1)), pages)
    assert fast == built
    assert (fast.page_ids, fast.samples, fast.count) == (built.page_ids, built.samples, 1)


def test_one_token_chunk_is_frozen_and_reads_pages_once():
    reads = []
    chunk = ScheduledChunk.one_token(
        sequence_of([1, 2], [3]), 2, 3, lambda: reads.append(1) or {"full": (5,)}
    )
    assert chunk.page_ids == chunk.page_ids == {"full": (5,)}
    assert reads == [1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        chunk.start = 0


@given(st.text(max_size=8), st.integers(0, 8), st.integers(0, 2**32 - 1))
def test_one_token_output_equals_the_dataclass(request_id, sample_index, token):
    fast = SampleOutput.one_token(request_id, sample_index, token)
    assert fast == SampleOutput(request_id, sample_index, (token,))
    assert hash(fast) == hash(SampleOutput(request_id, sample_index, (token,)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.finished = True
