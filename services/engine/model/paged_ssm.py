"""One SSM layer over a whole `ForwardBatch`, each sequence from the state in its pages.

Sequence b's chunk starts at token n = num_cached: it resumes from page `(n-1)//B` (zeros at
n = 0), writes the state after each block end it passes into that block's page where the block
has one (a hole, the null page, stores nothing), and the state after its last token into the
page of the block holding it (docs/engine-hybrid.md). A prefill chunk (several tokens) runs the
chunked scan on its own; every one-token chunk of the step (a decode, at whatever position, from
a running state or a snapshot) runs in one batched step (`ssm_step.py`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..attention.batch import ForwardBatch, SequenceChunk, StateRows
from ..config.model_config import STATE_GROUP
from .ssm import SSMState

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class SSMBatchPlan:
    """How a step's rows reach the SSM layers, worked out once for all of them."""

    decoding: StateRows | None  # the one-token chunks' state pages
    decode_rows: torch.Tensor | None  # their token rows; None when every row decodes
    prefills: tuple[tuple[int, SequenceChunk], ...]  # (first token row, chunk) of the others
    page_size: int
    null_page: int

    @classmethod
    def of(cls, batch: ForwardBatch, page_size: int, null_page: int) -> SSMBatchPlan:
        """The plan of `batch` (its `state_rows` when a decode graph filled them)."""
        if batch.state_rows is not None:
            return cls(batch.state_rows, None, (), page_size, null_page)
        offsets = [0, *itertools.accumulate(len(c.new_tokens) for c in batch.chunks)]
        ones = [i for i, c in enumerate(batch.chunks) if len(c.new_tokens) == 1]
        device = batch.token_ids.device
        decoding = None
        if ones:
            decoding = StateRows.of([batch.chunks[i] for i in ones], page_size, null_page, device)
        rows = None
        if len(ones) < len(batch.chunks):
            rows = torch.tensor([offsets[i] for i in ones], dtype=torch.int64).to(device)
        prefills = tuple(
            (offsets[i], c) for i, c in enumerate(batch.chunks) if len(c.new_tokens) > 1
        )
        return cls(decoding, rows, prefills, page_size, null_page)

    @classmethod
    def each(cls, batch: ForwardBatch, page_size: int, null_page: int) -> SSMBatchPlan:
        """Every chunk on its own, a one-token chunk by the recurrence: the per-sequence
        reference the batched step equals (tests, and the benches' baseline)."""
        offsets = [0, *itertools.accumulate(len(c.new_tokens) for c in batch.chunks)]
        none = torch.empty(0, dtype=torch.int64, device=batch.token_ids.device)
        prefills = tuple(zip(offsets[:-1], batch.chunks, strict=True))
        return cls(None, none, prefills, page_size, null_page)

    def run(self, mixer: nn.Module, x: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """The layer's outputs `[T, hidden]`; its states written into `states`. `mixer` is a
        recurrent layer: `SelectiveSSM` or `gated_delta.GatedDeltaNet` (both scan a chunk with
        `forward` and step every decoding row at once with `decode`)."""
        if self.decode_rows is None:
            return mixer.decode(x, states, self.decoding)
        out = torch.empty_like(x)
        if self.decoding is not None:
            rows = self.decode_rows
            out[rows] = mixer.decode(x[rows], states, self.decoding)
        for offset, chunk in self.prefills:
            count = len(chunk.new_tokens)
            part = x[offset : offset + count]
            out[offset : offset + count] = scan_chunk(
                mixer, part, chunk, states, self.page_size, self.null_page
            )
        return out


def scan_chunk(
    mixer: nn.Module,
    x: torch.Tensor,
    chunk: SequenceChunk,
    states: torch.Tensor,
    page_size: int,
    null_page: int,
) -> torch.Tensor:
    """One sequence's chunk `x [count, hidden]` from and into its state pages."""
    start, count = chunk.num_cached, len(chunk.new_tokens)
    pages = chunk.page_ids[STATE_GROUP]
    if start == 0:
        state = SSMState.zeros(mixer.shape, x.device)
    else:
        state = SSMState.from_flat(mixer.shape, states[pages[(start - 1) // page_size]])
    ends = frozenset(
        i
        for i in range(count - 1)
        if (start + i + 1) % page_size == 0 and pages[(start + i) // page_size] != null_page
    )
    y, final, kept = mixer(x, state, ends)
    for index, snapshot in kept.items():
        states[pages[(start + index) // page_size]].copy_(snapshot.flat())
    states[pages[(start + count - 1) // page_size]].copy_(final.flat())
    return y
