"""Decode attention over fp8 or bf16 pages: a split-KV paged kernel in Triton, CUDA only.

flash-attn takes no fp8 K/V, so a decode step over an fp8 cache used to gather the batch's
pages and dequantize them into a bf16 scratch pool first (`attn_flash.gather_dequantized`):
the pages were read once as fp8, written and read again as bf16. Here each program reads its
pages once, as bytes of e4m3, and dequantizes in registers (`stored * scale`, the head's
power-of-two scale: exact in bf16), so the step reads half the bytes a bf16 cache would.

One decode token per sequence (`cu_seqlens_q` is `arange(B + 1)`). Program (b, kv_head, split)
takes all the query heads of one KV head (GQA: the group is padded to 16 rows for `tl.dot`)
over one page-aligned part of sequence b's keys, with an online softmax; a second kernel merges
the parts by their log-sum-exp. The number of parts depends on shapes only (the batch and the
page table's width), so a captured CUDA graph replays it. A window keeps the last `window` keys;
a sequence with no keys (a graph's pad row) gets zeros and a log-sum-exp of -inf.

On a CPU tensor the kernels run in Triton's interpreter when `TRITON_INTERPRET=1` was set
before Triton was imported (tests only); its products are then fp32, as the interpreter has no
bf16 arithmetic (on the GPU, bf16 products with fp32 sums, as flash-attn's).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from ..config.triton_device import multiprocessors
from .batch import AttentionMetadata

KEYS_PER_BLOCK = 64  # keys per inner step (4 pages of 16 tokens)
MAX_SPLITS = 16


@dataclasses.dataclass(frozen=True)
class KernelShape:
    """The partial kernel's tiling: keys per inner step, warps and pipeline stages per program
    (bench/gpu/decode_attn_bench.py sweeps them; `shape_for` holds its pick)."""

    keys_per_block: int = KEYS_PER_BLOCK
    num_warps: int = 4
    num_stages: int = 3  # Triton's own defaults for NVIDIA: 4 warps, 3 stages


def shape_for(head_dim: int) -> KernelShape:
    """The tiling for `head_dim`: ~8k key elements per inner step (128 keys of head dim 64, 64
    of head dim 128), 4 warps, 3 stages.

    NOTE: swept on an H100 (docs/engine-gpu.md), 64 keys per step left the 1b shape (head dim
    64) at 0.87 of copy bandwidth and 128 reached 0.92; the 8b shape (head dim 128) is the
    other way round (0.97 with 64, 0.92 with 128). More warps or stages never paid."""
    keys = max(1, 8192 // head_dim)
    keys = 1 << (keys.bit_length() - 1)  # a power of two: the kernel's key block is tl.arange
    return KernelShape(keys_per_block=max(KEYS_PER_BLOCK, min(128, keys)))


@triton.jit
def _partial_kernel(
    q,
    q_token_stride,
    q_head_stride,
    k_pages,
    v_pages,
    page_stride,
    token_stride,
    head_stride,
    k_scale,
    v_scale,
    table,
    table_stride,
    seqused,
    window,
    sm_scale,
    part_acc,
    part_stats,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    SCALED: tl.constexpr,
    DOT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    kv_heads = tl.num_programs(1)
    keys = tl.load(seqused + seq)
    start = 0
    if HAS_WINDOW:
        start = tl.maximum(keys - window, 0)
    first_page = start // PAGE
    pages = tl.cdiv(keys, PAGE) - first_page
    per_split = tl.cdiv(pages, SPLITS)
    lo = (first_page + split * per_split) * PAGE
    hi = tl.minimum(lo + per_split * PAGE, keys)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_in = g < GROUP
    d_in = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_tile = tl.load(
        q + seq * q_token_stride + heads[:, None] * q_head_stride + d[None, :],
        mask=g_in[:, None] & d_in[None, :],
        other=0.0,
    ).to(DOT)
    k_mult = 1.0
    v_mult = 1.0
    if SCALED:
        k_mult = tl.load(k_scale + kv_head).to(tl.float32)
        v_mult = tl.load(v_scale + kv_head).to(tl.float32)

    # -1e30, not -inf: a block with no valid key then leaves the running sums unchanged.
    best = tl.full([BLOCK_G], -1e30, tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for block in range(lo, hi, BLOCK_N):
        tok = block + tl.arange(0, BLOCK_N)
        valid = (tok >= start) & (tok < hi)
        page = tl.load(table + seq * table_stride + tok // PAGE, mask=tok < hi, other=0)
        row = page.to(tl.int64) * page_stride + (tok % PAGE) * token_stride + kv_head * head_stride
        where = row[:, None] + d[None, :]
        both = valid[:, None] & d_in[None, :]
        k = tl.load(k_pages + where, mask=both, other=0.0)
        if SCALED:
            k = k.to(tl.float32) * k_mult
        k = k.to(DOT)
        scores = tl.dot(q_tile, tl.trans(k)) * sm_scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        shrink = tl.exp(best - new_best)
        weights = tl.exp(scores - new_best[:, None])
        total = total * shrink + tl.sum(weights, axis=1)
        v = tl.load(v_pages + where, mask=both, other=0.0)
        if SCALED:
            v = v.to(tl.float32) * v_mult
        v = v.to(DOT)
        acc = acc * shrink[:, None] + tl.dot(weights.to(DOT), v)
        best = new_best

    part = (seq * kv_heads + kv_head) * SPLITS + split
    tl.store(
        part_acc + (part * BLOCK_G + g[:, None]) * BLOCK_D + d[None, :],
        acc,
        mask=g_in[:, None] & d_in[None, :],
    )
    tl.store(part_stats + (part * BLOCK_G + g) * 2, best, mask=g_in)
    tl.store(part_stats + (part * BLOCK_G + g) * 2 + 1, total, mask=g_in)


@triton.jit
def _merge_kernel(
    part_acc,
    part_stats,
    out,
    out_token_stride,
    out_head_stride,
    lse,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    heads = tl.num_programs(1)
    kv_head = head // GROUP
    g = head % GROUP
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_in = s < SPLITS
    parts = (seq * (heads // GROUP) + kv_head) * SPLITS + s
    best = tl.load(part_stats + (parts * BLOCK_G + g) * 2, mask=s_in, other=-1e30)
    total = tl.load(part_stats + (parts * BLOCK_G + g) * 2 + 1, mask=s_in, other=0.0)
    top = tl.max(best, axis=0)
    weight = tl.where(total > 0, tl.exp(best - top), 0.0)
    denominator = tl.sum(total * weight, axis=0)
    acc = tl.load(
        part_acc + (parts[:, None] * BLOCK_G + g) * BLOCK_D + d[None, :],
        mask=s_in[:, None] & (d[None, :] < HEAD_DIM),
        other=0.0,
    )
    merged = tl.sum(acc * weight[:, None], axis=0) / tl.maximum(denominator, 1e-30)
    tl.store(
        out + seq * out_token_stride + head * out_head_stride + d,
        merged.to(out.dtype.element_ty),
        mask=d < HEAD_DIM,
    )
    log_sum = tl.where(denominator > 0, top + tl.log(denominator), float("-inf"))
    tl.store(lse + seq * heads + head, log_sum)


def splits_for(
    batch: int,
    kv_heads: int,
    max_pages: int,
    page_size: int,
    device,
    keys_per_block: int = KEYS_PER_BLOCK,
) -> int:
    """Parts per sequence: enough programs to fill the GPU twice over, at least a block of
    keys each; a function of shapes only (decode graphs replay it)."""
    programs = batch * kv_heads
    wanted = -(-2 * multiprocessors(device) // max(programs, 1))
    blocks = -(-max_pages * page_size // keys_per_block)
    return max(1, min(wanted, blocks, MAX_SPLITS))


def decode_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    meta: AttentionMetadata,
    window: int | None,
    scale: float,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None,
    shape: KernelShape | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One query token per sequence `q [B, heads, D]` over its pages `[num_pages, page,
    kv_heads, D]` (e4m3 times `kv_scales`, or the query's dtype with `kv_scales` None): the
    outputs `[B, heads, D]` and each head's log-sum-exp `[B, heads]` (fp32). `shape`: the
    tiling, `shape_for(D)` by default."""
    batch, heads, head_dim = q.shape
    shape = shape or shape_for(head_dim)
    _, page_size, kv_heads, _ = k_pages.shape
    group = heads // kv_heads
    table = meta.page_table
    splits = splits_for(batch, kv_heads, table.shape[1], page_size, q.device, shape.keys_per_block)
    block_g = max(16, triton.next_power_of_2(group))
    block_d = triton.next_power_of_2(head_dim)
    part_acc = torch.empty(batch * kv_heads * splits, block_g, block_d, device=q.device)
    part_stats = torch.empty(batch * kv_heads * splits, block_g, 2, device=q.device)
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, device=q.device, dtype=torch.float32)
    if batch == 0:
        return out, lse
    assert k_pages.stride() == v_pages.stride() and k_pages.stride(3) == 1, "one page layout"
    # Unscaled pages: the scale arguments are never read (SCALED is off), any pointer will do.
    k_scale, v_scale = (
        (s.float().contiguous() for s in kv_scales) if kv_scales is not None else (q, q)
    )
    _partial_kernel[(batch, kv_heads, splits)](
        q, q.stride(0), q.stride(1), k_pages, v_pages, k_pages.stride(0), k_pages.stride(1),
        k_pages.stride(2), k_scale, v_scale, table, table.stride(0), meta.seqused_k,
        window or 0, scale, part_acc, part_stats,
        GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim, BLOCK_D=block_d, PAGE=page_size,
        BLOCK_N=shape.keys_per_block, SPLITS=splits, HAS_WINDOW=window is not None,
        SCALED=kv_scales is not None, DOT=tl.float32 if q.device.type == "cpu" else tl.bfloat16,
        num_warps=shape.num_warps, num_stages=shape.num_stages,
    )  # fmt: skip
    _merge_kernel[(batch, heads)](
        part_acc, part_stats, out, out.stride(0), out.stride(1), lse,
        GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim, BLOCK_D=block_d, SPLITS=splits,
        BLOCK_S=triton.next_power_of_2(splits),
    )  # fmt: skip
    return out, lse
