"""One decode step of an SSM layer for every decoding sequence at once, over the state pages.

Row b of the batch reads its state from page `read[b]` and writes the state after its token
into page `write[b]` (the same page while the sequence stays in one block; the null page's
zeros are the state before a sequence's first token). The step is a fixed set of tensor ops
for any batch: gather the rows' states by index, the conv window update and the selective
state update (`state_update`, one fused kernel on CUDA through `fused.py`), scatter back. No
Python loop over sequences and no host sync, so it runs inside a captured decode graph with
`read` / `write` as graph inputs, like the page table. On CUDA with Triton the update runs as
two kernels that read and write the pages in place (`ssm_step_kernel.py`: one pass over the
states instead of the gather, update and scatter); `use_kernel(False)` keeps the torch ops
(the benches' baseline).

| tensor      | shape          | padded rows of a graph step                              |
| ----------- | -------------- | -------------------------------------------------------- |
| read        | [B] int64      | the null page (zeros)                                    |
| write       | [B] int64      | the null page                                            |
| keep        | [B] bool / None| False: the row writes zeros, so the null page stays zero |
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..config.triton_device import triton_runs_on
from .fused import fusable

if TYPE_CHECKING:
    from ..attention.batch import StateRows

_kernel = {"on": True}


def use_kernel(on: bool) -> None:
    """Serve CUDA decode steps with the in-place Triton kernels (the default) or torch ops."""
    _kernel["on"] = on


@functools.cache
def in_place_step(device_type: str) -> Callable | None:
    """The Triton step for tensors on `device_type`: CUDA, or any device under Triton's
    interpreter (tests); None without Triton (Triton is imported only here, when needed)."""
    if not triton_runs_on(device_type):
        return None
    try:
        from .ssm_step_kernel import state_update_in_place
    except ImportError:
        return None
    return state_update_in_place


def decode_step(
    mixer: nn.Module, x: torch.Tensor, states: torch.Tensor, rows: StateRows
) -> torch.Tensor:
    """`SelectiveSSM.decode`: outputs `[B, hidden]` of one token per row `x [B, hidden]`; each
    row's state moves from page `rows.read` to page `rows.write` of `states` (`[num_pages,
    floats]`, fp32)."""
    s = mixer.shape
    z, xbc, dt = mixer.in_proj(x).float().split([s.inner, s.conv_dim, s.num_heads], dim=-1)
    params = (mixer.conv_weight, mixer.conv_bias, mixer.dt_bias, mixer.A_log, mixer.D)
    in_place = in_place_step(states.device.type) if _kernel["on"] else None
    if in_place is not None:
        y = in_place(states, rows.read, rows.write, rows.keep, xbc, dt, *params, s.state_size)
    else:
        y, after = state_update(states, rows.read, rows.keep, xbc, dt, *params, s.state_size)
        states[:, : s.state_numel].index_copy_(0, rows.write, after)
    y = mixer.norm(y * F.silu(z))
    return mixer.out_proj(y.to(x.dtype))


@fusable
def state_update(
    states: torch.Tensor,
    read: torch.Tensor,
    keep: torch.Tensor | None,
    xbc: torch.Tensor,
    dt: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor,
    dt_bias: torch.Tensor,
    a_log: torch.Tensor,
    skip: torch.Tensor,
    state_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence's one step (`SelectiveSSM._scan_tokens`) for every row: outputs
    `[B, inner]` before the gate and the flat states after the token `[B, state_numel]`
    (zeros in the rows where `keep` is False; masked here, so the fused kernel does it)."""
    rows, heads = dt.shape
    conv_dim, kernel = conv_weight.shape
    split = (kernel - 1) * conv_dim
    flat = states[read]  # [B, floats]: each row's state, gathered
    conv = flat[:, :split].view(rows, kernel - 1, conv_dim)
    window = torch.cat([conv, xbc[:, None]], dim=1)  # [B, K, conv_dim], oldest first
    mixed = F.silu((window.transpose(1, 2) * conv_weight).sum(-1) + conv_bias)
    xt, b, c = mixed.split([conv_dim - 2 * state_size, state_size, state_size], dim=-1)
    xt = xt.view(rows, heads, -1)  # [B, H, P]
    dt = F.softplus(dt + dt_bias)
    ssm = flat[:, split : split + xt.shape[2] * heads * state_size]
    ssm = ssm.view(rows, heads, xt.shape[2], state_size)
    decay = torch.exp(dt * -torch.exp(a_log.float()))[..., None, None]
    ssm = decay * ssm + dt[..., None, None] * xt[..., None] * b[:, None, None, :]
    y = (ssm * c[:, None, None, :]).sum(-1) + skip[:, None] * xt
    after = torch.cat([window[:, 1:].flatten(1), ssm.flatten(1)], dim=1)
    if keep is not None:
        after = torch.where(keep[:, None], after, 0.0)
    return y.flatten(1), after
