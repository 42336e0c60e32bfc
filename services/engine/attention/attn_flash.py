"""`flash` backend: flash-attn's CuTe paged kernel (`flash_attn.cute`), CUDA only.

An fp8 cache: the kernel takes no fp8 K/V. A decode step (one new token per sequence) runs
`attn_decode_kernel.py`'s Triton kernel over the fp8 pages themselves (half a bf16 cache's KV
reads). Any other step (prefill chunks) gathers the batch's own pages (its page table's) and
dequantizes them into a scratch pool of the query's dtype, which the kernel reads through a
page table of local ids: each such step reads the fp8 pages, writes and reads them again in
bf16, and the scratch holds the batch's pages of one layer. Shapes come from the page table
alone on both paths, so a captured CUDA graph replays them (docs/engine-gpu.md).

A bf16 cache's decode steps run the same Triton kernel over its pages as they are (no
scales): on an H100 it read KV at 0.87-0.92 of copy bandwidth where flash-attn's paged kernel
read 0.70 at the 1b shape (batch 256), and 0.91 against 0.13 for two 64k-token sequences (a
fleet rank's long agent contexts), with the 8b shape a tie (docs/engine-gpu.md).
`use_bf16_decode_kernel(False)` sends them to flash-attn (the benches' baseline).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from ..config.triton_device import multiprocessors, triton_runs_on
from ..kv.kv_quant import dequantize
from .batch import AttentionMetadata


@functools.cache
def flash_attn_importable() -> bool:
    """Whether `flash_attn.cute` imports here (it needs a Hopper or Blackwell GPU to run)."""
    try:
        import flash_attn.cute  # noqa: F401
    except Exception:
        return False
    return True


_decode_kernel = {"fp8": True, "bf16": True}


def use_fp8_decode_kernel(on: bool) -> None:
    """Decode over fp8 pages with the Triton kernel (the default) or by gathering and
    dequantizing the pages first (the benches' baseline)."""
    _decode_kernel["fp8"] = on


def use_bf16_decode_kernel(on: bool) -> None:
    """Decode over bf16/fp16 pages with the Triton kernel (the default) or with flash-attn's
    paged kernel (the benches' baseline, docs/engine-gpu.md)."""
    _decode_kernel["bf16"] = on


@functools.cache
def paged_decode_kernel(device_type: str) -> Callable | None:
    """The Triton paged decode kernel (fp8 or bf16 pages) for tensors on `device_type`: CUDA,
    or any device under Triton's interpreter (tests); None without Triton (imported only here,
    when needed)."""
    if not triton_runs_on(device_type):
        return None
    try:
        from .attn_decode_kernel import decode_attention
    except ImportError:
        return None
    return decode_attention


def flash_supports(device: torch.device) -> bool:
    """CUDA of compute capability 9 or newer (Hopper, Blackwell), with `flash_attn.cute`."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 9 and flash_attn_importable()


class FlashAttention:
    """Calls `flash_attn_varlen_func` with `page_table` and `seqused_k` (bf16/fp16 only).

    NOTE: flash-attn's own split-KV (`num_splits > 1`) is refused on SM 9.0 by the pinned
    flash-attn-4. `kv_splits > 1` does the split outside the kernel for decode steps (one new
    token per sequence, no window): each sequence's pages are cut into that many page-aligned
    parts, run as separate sequences of one call, and merged by their log-sum-exp. Measured on
    an H200 (docs/engine-gpu.md) it never paid: unsplit decode already streams KV at 73-83 %
    of copy bandwidth at batch >= 32 (90-100 % in a CUDA graph), and at small batches the
    call is latency-bound. So the default is 1; `kv_splits=0` splits only when the batch has
    fewer (sequence, KV head) pairs than the GPU has multiprocessors.

    Sinks (gpt-oss) are applied after the kernel, from its log-sum-exp: with a sink logit s,
    every weight of the sinkless softmax shrinks by exp(lse) / (exp(lse) + exp(s)), so
    out_sink = out * sigmoid(lse - s), exact and independent of the kernel's own sink support
    (flash-attn 2.x has none). A step with sinks is never split.
    """

    name = "flash"

    def __init__(self, kv_splits: int = 1, pack_gqa: bool | None = None) -> None:
        from flash_attn.cute import flash_attn_varlen_func

        if kv_splits < 0:
            raise ValueError(f"kv_splits must be >= 0, got {kv_splits}")
        self._kernel = flash_attn_varlen_func
        self.kv_splits = kv_splits
        self.pack_gqa = pack_gqa

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
        kernel = _decode_kernel["fp8" if kv_scales is not None else "bf16"]
        decode = paged_decode_kernel(q.device.type) if kernel else None
        if decode is not None and meta.max_seqlen_q == 1:
            out, lse = decode(q, k_pages, v_pages, meta, window, scale, kv_scales)
            return out if sinks is None else with_sinks(out, lse, sinks)
        if kv_scales is not None:
            k_pages, v_pages, meta = gather_dequantized(k_pages, v_pages, meta, kv_scales, q.dtype)
        splits = 1 if sinks is not None else self._decode_splits(q, k_pages, meta, window)
        if splits > 1:
            return self._split_decode(q, k_pages, v_pages, meta, scale, splits)
        out = self._call(
            q,
            k_pages,
            v_pages,
            meta.cu_seqlens_q,
            meta.seqused_k,
            meta.page_table,
            meta.max_seqlen_q,
            meta.max_seqlen_k,
            window,
            scale,
            return_lse=sinks is not None,
        )
        if sinks is None:
            return out[0] if isinstance(out, tuple) else out
        out, lse = out
        return with_sinks(out, lse.float().t(), sinks)

    def _call(
        self,
        q,
        k_pages,
        v_pages,
        cu_seqlens_q,
        seqused_k,
        page_table,
        max_q,
        max_k,
        window,
        scale,
        return_lse,
    ):
        return self._kernel(
            q,
            k_pages,
            v_pages,
            cu_seqlens_q=cu_seqlens_q,
            seqused_k=seqused_k,
            page_table=page_table,
            max_seqlen_q=max_q,
            max_seqlen_k=max_k,
            softmax_scale=scale,
            causal=True,
            window_size=(window - 1, 0) if window is not None else (None, None),
            num_splits=1,
            pack_gqa=self.pack_gqa,
            return_lse=return_lse,
        )

    def _decode_splits(self, q, k_pages, meta: AttentionMetadata, window: int | None) -> int:
        """How many parts to split each sequence's KV into (1: no split)."""
        if meta.max_seqlen_q != 1 or window is not None:
            return 1
        max_pages = -(-meta.max_seqlen_k // meta.page_size)
        if self.kv_splits:
            return max(1, min(self.kv_splits, max_pages))
        # One thread block per (sequence, KV head) without a split: split only an underfilled GPU.
        blocks = len(meta.query_lens) * k_pages.shape[2]
        sms = multiprocessors(q.device)
        if blocks >= sms:
            return 1
        return max(1, min(-(-sms // blocks), max_pages, 16))

    def _split_decode(self, q, k_pages, v_pages, meta: AttentionMetadata, scale, splits):
        """Decode attention with each sequence's pages cut into `splits` page-aligned parts."""
        batch, page_size = len(meta.query_lens), meta.page_size
        per_part = -(-meta.page_table.shape[1] // splits)
        table = meta.page_table
        if per_part * splits != table.shape[1]:
            pad = per_part * splits - table.shape[1]
            table = torch.nn.functional.pad(table, (0, pad))  # page 0: masked out by seqused
        table = table.view(batch * splits, per_part)
        part_start = torch.arange(splits, device=q.device, dtype=torch.int32) * (
            per_part * page_size
        )
        seqused = (meta.seqused_k[:, None] - part_start[None, :]).clamp(0, per_part * page_size)
        cu = torch.arange(batch * splits + 1, device=q.device, dtype=torch.int32)
        q_parts = q.repeat_interleave(splits, dim=0)
        out, lse = self._call(
            q_parts,
            k_pages,
            v_pages,
            cu,
            seqused.flatten().contiguous(),
            table,
            1,
            per_part * page_size,
            None,
            scale,
            return_lse=True,
        )
        # lse: [heads, batch*splits] -> [batch, splits, heads, 1]
        lse = lse.float().t().reshape(batch, splits, -1, 1)
        weight = torch.exp(lse - lse.amax(dim=1, keepdim=True))
        weight = torch.where(torch.isfinite(lse), weight, torch.zeros_like(weight))
        parts = out.float().reshape(batch, splits, *out.shape[1:]).nan_to_num()
        merged = (parts * weight).sum(dim=1) / weight.sum(dim=1)
        return merged.to(q.dtype)


def gather_dequantized(
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    meta: AttentionMetadata,
    kv_scales: tuple[torch.Tensor, torch.Tensor],
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The pages `meta.page_table` names, dequantized to `dtype` as a pool of their own
    `[B * P, page, KVH, D]`, and `meta` with the table `[B, P]` of their ids in it."""
    table = meta.page_table
    index = table.flatten().long()
    # NOTE: gathered as bytes: index kernels do not all take fp8.
    k = k_pages.view(torch.uint8).index_select(0, index).view(k_pages.dtype)
    v = v_pages.view(torch.uint8).index_select(0, index).view(v_pages.dtype)
    k, v = dequantize(k, kv_scales[0], dtype), dequantize(v, kv_scales[1], dtype)
    local = torch.arange(index.numel(), device=table.device, dtype=table.dtype)
    return k, v, dataclasses.replace(meta, page_table=local.view(table.shape))


def with_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Sinkless attention `out [T, H, D]` with its log-sum-exp `lse [T, H]` rescaled as if each
    head's softmax had had one more column, its sink logit `sinks [H]`, of value zero."""
    keep = torch.sigmoid(lse - sinks.float()[None, :])
    return (out.float() * keep[..., None]).to(out.dtype)
