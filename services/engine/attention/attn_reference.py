"""`reference` backend: plain fp32 math per sequence; the definition the others must match."""

from __future__ import annotations

import torch

from ..kv.kv_quant import dequantize
from .batch import AttentionMetadata


def attention_mask(
    query_positions: torch.Tensor, num_keys: int, window: int | None
) -> torch.Tensor:
    """Bool `[queries, keys]`: key j is visible to a query at position p iff p-window < j <= p."""
    keys = torch.arange(num_keys, device=query_positions.device)
    delta = query_positions[:, None] - keys[None, :]
    visible = delta >= 0
    if window is not None:
        visible &= delta < window
    return visible


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    query_positions: torch.Tensor,
    window: int | None,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of `q [n, H, D]` over contiguous `k`, `v` `[ctx, KVH, D]`, in fp32; `sinks
    [H]`: each head's sink logit, one more softmax column whose value is zero."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    mask = attention_mask(query_positions, k.shape[0], window)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = scores.softmax(dim=-1)
    else:
        sink = sinks.float()[:, None, None].expand(-1, scores.shape[1], 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)


def gather_pages(pages: torch.Tensor, page_ids: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Tokens `[num_tokens, KVH, D]` of one sequence read from its pages in order."""
    page_size = pages.shape[1]
    used = page_ids[: -(-num_tokens // page_size)].long()
    return pages[used].flatten(0, 1)[:num_tokens]


class ReferenceAttention:
    """Loops over sequences; gathers each one's pages and does the math in fp32."""

    name = "reference"

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
        out = torch.empty_like(q)
        start = 0
        for b, (n, ctx) in enumerate(zip(meta.query_lens, meta.context_lens, strict=True)):
            k = gather_pages(k_pages, meta.page_table[b], ctx)
            v = gather_pages(v_pages, meta.page_table[b], ctx)
            if kv_scales is not None:
                k = dequantize(k, kv_scales[0], torch.float32)
                v = dequantize(v, kv_scales[1], torch.float32)
            positions = torch.arange(ctx - n, ctx, device=q.device)
            out[start : start + n] = dense_attention(
                q[start : start + n], k, v, positions, window, scale, sinks
            )
            start += n
        return out
