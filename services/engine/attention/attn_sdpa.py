"""`sdpa` backend: PyTorch scaled_dot_product_attention over pages gathered into a padded batch.

SDPA has no sink input. A sink is a key whose score is the head's sink logit and whose value is
zero: so with sinks, one zero key and zero value are appended and the mask turns into an
additive float mask whose last column is each head's sink logit (q . 0 + sink = sink).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kv.kv_quant import dequantize
from .batch import AttentionMetadata


class SdpaAttention:
    """Gathers every sequence's pages into `[B, KVH, max_ctx, D]` and calls SDPA once."""

    name = "sdpa"

    def forward(
        self,
        q: torch.Tensor,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        meta: AttentionMetadata,
        window: int | None,
        scale: float,
        sinks: torch.Tensor | None = None,
        kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Attention of the new queries over their sequences' pages (reads only)."""
        batch, max_q = len(meta.query_lens), meta.max_seqlen_q
        num_keys = meta.page_table.shape[1] * meta.page_size
        table = meta.page_table.long()
        k, v = k_pages[table], v_pages[table]  # [B, P, page, KVH, D]
        if kv_scales is not None:
            k = dequantize(k, kv_scales[0], q.dtype)
            v = dequantize(v, kv_scales[1], q.dtype)
        # [B, P, page, KVH, D] -> [B, KVH, P*page, D]
        k = k.flatten(1, 2).transpose(1, 2)
        v = v.flatten(1, 2).transpose(1, 2)
        group = q.shape[1] // k.shape[1]
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        row, col = _padded_index(meta, q.device)
        q_pad = q.new_zeros(batch, max_q, *q.shape[1:])
        q_pad[row, col] = q
        mask = self._mask(meta, num_keys, window, q.device)[:, None]
        if sinks is not None:
            k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))
            mask = _with_sink_column(mask, sinks, q.dtype)
        out = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2), k, v, attn_mask=mask, scale=scale
        )
        return out.transpose(1, 2)[row, col]

    @staticmethod
    def _mask(
        meta: AttentionMetadata, num_keys: int, window: int | None, device: torch.device
    ) -> torch.Tensor:
        """Bool `[B, max_q, keys]`; padded query rows see key 0 so that softmax stays finite."""
        q_lens = meta.cu_seqlens_q[1:] - meta.cu_seqlens_q[:-1]
        ctx = meta.seqused_k.long()
        row = torch.arange(meta.max_seqlen_q, device=device)
        positions = ctx[:, None] - q_lens[:, None].long() + row[None, :]
        delta = positions[:, :, None] - torch.arange(num_keys, device=device)[None, None, :]
        visible = delta >= 0
        if window is not None:
            visible &= delta < window
        padded = row[None, :] >= q_lens[:, None]
        visible[:, :, 0] |= padded
        return visible


def _with_sink_column(visible: torch.Tensor, sinks: torch.Tensor, dtype) -> torch.Tensor:
    """Additive mask `[B, H, max_q, keys + 1]` of bool `visible [B, 1, max_q, keys]`: 0 where
    visible, -inf elsewhere, and head h's sink logit in the last column."""
    batch, _, rows, _ = visible.shape
    bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    bias = bias.masked_fill(~visible, float("-inf")).expand(-1, sinks.numel(), -1, -1)
    sink = sinks.to(dtype)[None, :, None, None].expand(batch, -1, rows, 1)
    return torch.cat([bias, sink], dim=-1)


def _padded_index(
    meta: AttentionMetadata, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, row) of each flattened new token in the padded `[B, max_q]` layout."""
    q_lens = (meta.cu_seqlens_q[1:] - meta.cu_seqlens_q[:-1]).long()
    row = torch.repeat_interleave(torch.arange(len(meta.query_lens), device=device), q_lens)
    col = (
        torch.arange(int(meta.cu_seqlens_q[-1]), device=device) - meta.cu_seqlens_q[:-1].long()[row]
    )
    return row, col
