"""The selective scan in chunks (Mamba-2's SSD form), plain torch: what prefill runs.

For a run of L tokens from state h0, with per-token log decay a_t = dt_t * A and its running
sum S_t = a_1 + ... + a_t (per head):

    y_t   = sum_{s<=t} exp(S_t - S_s) (C_t . B_s) dt_s x_s  +  exp(S_t) h0 C_t  +  D x_t
    h_L   = exp(S_L) h0 + sum_s exp(S_L - S_s) dt_s x_s B_s^T

which is the token-by-token recurrence (`SelectiveSSM`'s reference loop) unrolled: one
[L, L] masked matrix per head instead of L dependent steps. Runs end at every token whose
state is kept (a block end), so each snapshot is a run's end state; a run is at most
`chunk_tokens` long.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

CHUNK_TOKENS = 64


def causal_conv(
    conv_state: torch.Tensor, xbc: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(conv) of every token `xbc [T, D]` after `conv_state [K-1, D]`, and the window
    `[T + K - 1, D]` (oldest first) whose rows t+1 .. t+K-1 are the conv state after token t."""
    kernel = weight.shape[1]
    window = torch.cat([conv_state, xbc])
    mixed = (window.unfold(0, kernel, 1) * weight).sum(-1) + bias  # [T, D, K] -> [T, D]
    return F.silu(mixed), window


def run_ends(count: int, keep_after: Iterable[int], chunk_tokens: int = CHUNK_TOKENS) -> list[int]:
    """Exclusive ends of the runs over `count` tokens: each kept index ends one."""
    kept = sorted(i + 1 for i in keep_after if 0 <= i < count)
    ends, start = [], 0
    for stop in [*kept, count]:
        while stop - start > chunk_tokens:
            start += chunk_tokens
            ends.append(start)
        if stop > start:
            ends.append(stop)
            start = stop
    return ends


def chunk_scan(
    x: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    dt: torch.Tensor,
    decay_rate: torch.Tensor,
    skip: torch.Tensor,
    h0: torch.Tensor,
    ends: list[int],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Outputs `[T, H, P]` of `x [T, H, P]` (with `b, c [T, N]`, `dt [T, H]`, A = `decay_rate
    [H]`, D = `skip [H]`) from state `h0 [H, P, N]`, and the state at each of `ends`."""
    outputs, states, h, start = [], [], h0, 0
    for stop in ends:
        y, h = _run(x[start:stop], b[start:stop], c[start:stop], dt[start:stop], decay_rate, h)
        outputs.append(y + skip[None, :, None] * x[start:stop])
        states.append(h)
        start = stop
    return torch.cat(outputs), states


def _run(x, b, c, dt, decay_rate, h0) -> tuple[torch.Tensor, torch.Tensor]:
    """One run of L tokens: outputs without the skip term, and the end state."""
    length = x.shape[0]
    log_decay = torch.cumsum(dt * decay_rate, dim=0)  # S_t [L, H]
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
    diff = log_decay[:, None, :] - log_decay[None, :, :]  # S_t - S_s [t, s, H]
    decay = torch.exp(diff.masked_fill(~causal[..., None], float("-inf")))
    weights = decay * (c @ b.T)[..., None] * dt[None, :, :]  # [t, s, H]
    y = torch.einsum("tsh,shp->thp", weights, x)
    y = y + torch.exp(log_decay)[..., None] * torch.einsum("hpn,tn->thp", h0, c)
    to_end = torch.exp(log_decay[-1][None, :] - log_decay) * dt  # [s, H]
    h = torch.exp(log_decay[-1])[:, None, None] * h0
    h = h + torch.einsum("sh,shp,sn->hpn", to_end, x, b)
    return y, h
