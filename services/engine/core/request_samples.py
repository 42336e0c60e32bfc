"""A request's samples as the engine core tracks them: one `Sequence` per sample."""

from __future__ import annotations

import dataclasses

from ..compute.sampling import make_generator
from ..request.engine_request import GenerateCall
from ..request.sequence import Sequence


def samples_of(call: GenerateCall, now: float, count: int | None = None) -> list[Sequence]:
    """The sequences of a request arriving at `now`: its `num_samples` (or `count`), `rid#i`.

    Sample i > 0 samples with seed + i and waits for sample 0's prompt (its parent)."""
    sequences: list[Sequence] = []
    for index in range(call.num_samples if count is None else count):
        sampling = call.sampling
        if sampling.seed is not None and index:
            sampling = dataclasses.replace(sampling, seed=sampling.seed + index)
        sequences.append(
            Sequence(
                key=f"{call.request_id}#{index}",
                call=call,
                sample_index=index,
                sampling=sampling,
                generator=None if sampling.greedy else make_generator(sampling, "cpu"),
                arrived_at=now,
                parent=sequences[0] if sequences else None,
                grammar=call.grammar.start() if call.grammar else None,
            )
        )
    return sequences
