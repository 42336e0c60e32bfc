"""RoPE and the KV write of a packed q/k/v projection in one Triton kernel, CUDA only.

A decode step's attention input took three small kernels a layer: q and k rotated, K and V
zeroed on a graph's pad rows and stacked, then copied into their pages. Here program (t, h)
reads head h of token t's packed projection once: a query head is rotated into `q`, a key head
rotated and stored at the token's slot, a value head stored as it is. A pad row (`valid` 0)
stores nothing, so the null page it points at stays zeros.

On a CPU tensor the kernel runs in Triton's interpreter when `TRITON_INTERPRET=1` was set before
Triton was imported (tests only).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_store_kernel(
    qkv,
    cos,
    sin,
    q,
    pages,
    slots,
    valid,
    qkv_stride,
    kv_stride,
    slot_stride,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HAS_VALID: tl.constexpr,
):
    token, head = tl.program_id(0), tl.program_id(1)
    d = tl.arange(0, HALF)
    src = qkv + token * qkv_stride + head * 2 * HALF
    x1 = tl.load(src + d).to(tl.float32)
    x2 = tl.load(src + HALF + d).to(tl.float32)
    if head < HEADS + KV_HEADS:
        # as apply_rope: cos and sin rounded to the input's dtype; one rounding at the end, as
        # its fused kernel does
        c = tl.load(cos + token * HALF + d).to(qkv.dtype.element_ty).to(tl.float32)
        s = tl.load(sin + token * HALF + d).to(qkv.dtype.element_ty).to(tl.float32)
        out1 = x1 * c - x2 * s
        out2 = x2 * c + x1 * s
    else:
        out1, out2 = x1, x2
    if head < HEADS:
        dst = q + (token * HEADS + head) * 2 * HALF
        tl.store(dst + d, out1.to(q.dtype.element_ty))
        tl.store(dst + HALF + d, out2.to(q.dtype.element_ty))
    else:
        keep = tl.load(valid + token) != 0 if HAS_VALID else True
        if keep:
            is_value = (head >= HEADS + KV_HEADS).to(tl.int32)
            kv_head = head - HEADS - KV_HEADS * is_value
            slot = tl.load(slots + token)
            dst = pages + is_value.to(tl.int64) * kv_stride + slot * slot_stride
            dst += kv_head * 2 * HALF
            tl.store(dst + d, out1.to(pages.dtype.element_ty))
            tl.store(dst + HALF + d, out2.to(pages.dtype.element_ty))


def rope_store(
    qkv: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    pages: torch.Tensor,
    slots: torch.Tensor,
    valid: torch.Tensor | None,
    heads: int,
) -> torch.Tensor:
    """Rotated q `[T, heads, D]` of `qkv [T, (heads + 2 * kv_heads) * D]` (q, k, v heads side
    by side, rows contiguous), with k rotated and v stored at `slots [T]` of one layer's
    `pages [2, slots, kv_heads, D]` (K then V), where `valid [T]` (None: every row) is set.
    `rope` is `rope_angles`' cos and sin `[T, 1, D / 2]`, fp32."""
    tokens = qkv.shape[0]
    kv_heads, head_dim = pages.shape[2], pages.shape[3]
    cos, sin = (t.reshape(tokens, head_dim // 2).contiguous() for t in rope)
    q = torch.empty(tokens, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    _rope_store_kernel[(tokens, heads + 2 * kv_heads)](
        qkv,
        cos,
        sin,
        q,
        pages,
        slots,
        valid if valid is not None else slots,
        qkv.stride(0),
        pages.stride(0),
        pages.stride(1),
        HEADS=heads,
        KV_HEADS=kv_heads,
        HALF=head_dim // 2,
        HAS_VALID=valid is not None,
        num_warps=1,
    )
    return q
