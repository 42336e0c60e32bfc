"""The batched SSM decode step as two Triton kernels that read and write the state pages in place.

`ssm_step.state_update` gathers every row's state, updates it and scatters it back: four
passes over the states (the largest tensor a hybrid decode step touches: 2 MiB per sequence
and layer for hybrid-8b) and, where inductor cannot compile it, a dozen more. Here each row's
state is read once from page `read[b]` and written once into page `write[b]`:

1. `conv`: per row and block of channels, the causal conv over the stored window plus the new
   input (silu after it) into `mixed [B, conv_dim]`, and the window shifted by one into the
   write page. One program owns each channel, so a row that stays in its page (read == write)
   reads its window before it writes it.
2. `scan`: per row, head and block of head dims, the selective state update of `[P, N]` from
   the read page into the write page, and the outputs `y [B, inner]` (before the gate).

Rows with `keep` False (a graph's pad rows) store zeros, so the null page stays zero. Both
kernels are plain launches, so decode graphs capture them. On a CPU tensor the kernels run in
Triton's interpreter when `TRITON_INTERPRET=1` was set before Triton was imported (tests
only). `ssm_step` imports this module only where it serves: a CUDA device, or the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_kernel(
    states,
    row_stride,
    read,
    write,
    keep,
    xbc,
    xbc_stride,
    weight,
    bias,
    mixed,
    conv_dim,
    HAS_KEEP: tl.constexpr,
    KERNEL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    ch = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = ch < conv_dim
    src = states + tl.load(read + row).to(tl.int64) * row_stride
    dst = states + tl.load(write + row).to(tl.int64) * row_stride
    new = tl.load(xbc + row * xbc_stride + ch, mask=inside, other=0.0)
    acc = tl.load(bias + ch, mask=inside, other=0.0).to(tl.float32)
    acc += new * tl.load(weight + ch * KERNEL + (KERNEL - 1), mask=inside, other=0.0)
    # The stored window, oldest first: every tap read before any is overwritten.
    older = tl.load(src + ch, mask=inside, other=0.0)
    acc += older * tl.load(weight + ch * KERNEL, mask=inside, other=0.0)
    kept = 1.0
    if HAS_KEEP:
        kept = tl.load(keep + row).to(tl.float32)
    for k in tl.static_range(1, KERNEL - 1):
        tap = tl.load(src + k * conv_dim + ch, mask=inside, other=0.0)
        acc += tap * tl.load(weight + ch * KERNEL + k, mask=inside, other=0.0)
        tl.store(dst + (k - 1) * conv_dim + ch, tap * kept, mask=inside)
    if KERNEL > 1:
        tl.store(dst + (KERNEL - 2) * conv_dim + ch, new * kept, mask=inside)
    tl.store(mixed + row * conv_dim + ch, acc * tl.sigmoid(acc), mask=inside)


@triton.jit
def _scan_kernel(
    states,
    row_stride,
    read,
    write,
    keep,
    mixed,
    dt,
    dt_stride,
    dt_bias,
    a_log,
    skip,
    y,
    split,
    conv_dim,
    head_dim,
    state_size,
    HAS_KEEP: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    p_in = p < head_dim
    n_in = n < state_size
    inner = conv_dim - 2 * state_size
    channel = head * head_dim + p
    x = tl.load(mixed + row * conv_dim + channel, mask=p_in, other=0.0)
    b = tl.load(mixed + row * conv_dim + inner + n, mask=n_in, other=0.0)
    c = tl.load(mixed + row * conv_dim + inner + state_size + n, mask=n_in, other=0.0)
    step = tl.load(dt + row * dt_stride + head).to(tl.float32)
    step += tl.load(dt_bias + head).to(tl.float32)
    step = tl.where(step > 20.0, step, tl.log(1.0 + tl.exp(step)))  # softplus
    decay = tl.exp(-step * tl.exp(tl.load(a_log + head).to(tl.float32)))
    offsets = split + channel[:, None] * state_size + n[None, :]
    both = p_in[:, None] & n_in[None, :]
    src = states + tl.load(read + row).to(tl.int64) * row_stride
    dst = states + tl.load(write + row).to(tl.int64) * row_stride
    state = tl.load(src + offsets, mask=both, other=0.0)
    state = decay * state + (step * x)[:, None] * b[None, :]
    out = tl.sum(state * c[None, :], axis=1) + tl.load(skip + head).to(tl.float32) * x
    tl.store(y + row * inner + channel, out, mask=p_in)
    if HAS_KEEP:
        state = state * tl.load(keep + row).to(tl.float32)
    tl.store(dst + offsets, state, mask=both)


def state_update_in_place(
    states: torch.Tensor,
    read: torch.Tensor,
    write: torch.Tensor,
    keep: torch.Tensor | None,
    xbc: torch.Tensor,
    dt: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor,
    dt_bias: torch.Tensor,
    a_log: torch.Tensor,
    skip: torch.Tensor,
    state_size: int,
) -> torch.Tensor:
    """`ssm_step.state_update` followed by its scatter into `write`, without the copies: each
    row's state moves from page `read` to page `write` of `states` (`[num_pages, floats]`,
    fp32, row-contiguous); returns the outputs `[B, inner]` (fp32) before the gate."""
    rows, heads = dt.shape
    conv_dim, kernel = conv_weight.shape
    inner = conv_dim - 2 * state_size
    head_dim = inner // heads
    assert states.dtype == torch.float32 and states.stride(1) == 1, "fp32 row-major state pages"
    assert kernel >= 2, "a causal conv of one tap keeps no window"
    xbc, dt = xbc.float().contiguous(), dt.float().contiguous()
    weight = conv_weight.float().contiguous()
    mixed = torch.empty(rows, conv_dim, dtype=torch.float32, device=xbc.device)
    y = torch.empty(rows, inner, dtype=torch.float32, device=xbc.device)
    if rows == 0:
        return y
    flag = keep if keep is not None else read  # any tensor: HAS_KEEP tells the kernel
    block = 256
    _conv_kernel[(rows, triton.cdiv(conv_dim, block))](
        states, states.stride(0), read, write, flag, xbc, xbc.stride(0), weight,
        conv_bias, mixed, conv_dim, HAS_KEEP=keep is not None, KERNEL=kernel, BLOCK=block,
    )  # fmt: skip
    block_p = min(16, triton.next_power_of_2(head_dim))
    _scan_kernel[(rows, heads, triton.cdiv(head_dim, block_p))](
        states, states.stride(0), read, write, flag, mixed, dt, dt.stride(0), dt_bias, a_log,
        skip, y, (kernel - 1) * conv_dim, conv_dim, head_dim, state_size,
        HAS_KEEP=keep is not None, BLOCK_P=block_p, BLOCK_N=triton.next_power_of_2(state_size),
    )  # fmt: skip
    return y
