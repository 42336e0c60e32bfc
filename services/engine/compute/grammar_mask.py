"""Constrained rows of a step's logits: each sample's grammar mask, applied before sampling.

The masks are computed on the core thread (llguidance fills them in parallel, without the
GIL), copied to the logits' device as packed bits (vocab / 32 words a row) and unpacked
there; tokens outside the mask get -inf. Rows without a grammar are not touched, and a step
with none costs nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from llguidance import LLExecutor

from ..request.grammar import GrammarState


class LogitMasks:
    """Applies grammar masks to logits (one per compute backend: its mask threads)."""

    def __init__(self) -> None:
        self._executor = LLExecutor()

    def apply(self, logits: torch.Tensor, rows: Sequence[tuple[int, GrammarState]]) -> None:
        """Set to -inf, in place, each `(row, state)`'s logits of tokens its grammar refuses
        now; a token id past the grammar's vocabulary (padding of the model's) is refused
        too."""
        if not rows:
            return
        vocab = logits.shape[-1]
        words = (rows[0][1].vocab_size + 31) // 32
        packed = torch.zeros(len(rows), words, dtype=torch.int32)
        self._executor.unsafe_compute_mask_ptr(
            [(state.matcher, index) for index, (_row, state) in enumerate(rows)],
            packed.data_ptr(),
            words * 4,
            len(rows),
        )
        device = logits.device
        bits = torch.arange(32, dtype=torch.int32, device=device)
        allowed = ((packed.to(device)[:, :, None] >> bits) & 1).reshape(len(rows), -1).bool()
        if allowed.shape[1] < vocab:
            allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
        index = torch.tensor([row for row, _state in rows], device=device)
        with torch.inference_mode():  # the model's logits are inference tensors
            logits[index] = logits[index].masked_fill(~allowed[:, :vocab], float("-inf"))
