"""The selective scan in chunks (Mamba-2's SSD form), plain torch: what prefill runs.

For a run of L tokens from state h0, with per-token log decay a_t = dt_t * A and its running
sum S_t = a_1 + ... + a_t (per head):

    y_t   = sum_{s<=t} exp(S_t - S_s) (C_t . B_s) dt_s x_s  +  exp(S_t) h0 C_t  +  D x_t
    h_L   = exp(S_L) h0 + sum_s exp(S_L - S_s) dt_s x_s B_s^T

which is the token-by-token recurrence (`SelectiveSSM`'s reference loop) unrolled: one
[L, L] masked matrix per head instead of L dependent steps. Runs are `chunk_tokens` long; the
state after a kept token t inside a run (a block end: a snapshot to store) is h_t by the same
sum over s <= t, read off the run's decay matrix.
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


def run_ends(count: int, chunk_tokens: int = CHUNK_TOKENS) -> list[int]:
    """Exclusive ends of the runs over `count` tokens."""
    return [*range(chunk_tokens, count, chunk_tokens), count]


def chunk_scan(
    x: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    dt: torch.Tensor,
    decay_rate: torch.Tensor,
    skip: torch.Tensor,
    h0: torch.Tensor,
    keep_after: Iterable[int] = (),
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """Outputs `[T, H, P]` of `x [T, H, P]` (with `b, c [T, N]`, `dt [T, H]`, A = `decay_rate
    [H]`, D = `skip [H]`) from state `h0 [H, P, N]`, the state after the last token, and the
    state after each token index in `keep_after`."""
    keep = sorted(set(keep_after))
    outputs, kept, h, start = [], {}, h0, 0
    for stop in run_ends(x.shape[0], chunk_tokens):
        inside = [t - start for t in keep if start <= t < stop]
        run = (x[start:stop], b[start:stop], c[start:stop], dt[start:stop])
        y, h_next, states = _run(*run, decay_rate, h, inside)
        kept.update({start + t: state for t, state in zip(inside, states, strict=True)})
        outputs.append(y + skip[None, :, None] * x[start:stop])
        h, start = h_next, stop
    return torch.cat(outputs), h, kept


def _run(x, b, c, dt, decay_rate, h0, inside: list[int]):
    """One run of L tokens: outputs without the skip term, the end state, and the states after
    the run's tokens `inside`."""
    length = x.shape[0]
    log_decay = torch.cumsum(dt * decay_rate, dim=0)  # S_t [L, H]
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
    diff = log_decay[:, None, :] - log_decay[None, :, :]  # S_t - S_s [t, s, H]
    decay = torch.exp(diff.masked_fill(~causal[..., None], float("-inf")))
    weights = decay * (c @ b.T)[..., None] * dt[None, :, :]  # [t, s, H]
    y = torch.einsum("tsh,shp->thp", weights, x)
    y = y + torch.exp(log_decay)[..., None] * torch.einsum("hpn,tn->thp", h0, c)
    ends = [*inside, length - 1]  # h_t = exp(S_t) h0 + sum_{s<=t} exp(S_t - S_s) dt_s x_s B_s^T
    to_t = decay[ends] * dt[None, :, :]  # [k, s, H]
    states = torch.exp(log_decay[ends])[:, :, None, None] * h0[None]
    states = states + torch.einsum("ksh,shp,sn->khpn", to_t, x, b)
    return y, states[-1], list(states[:-1])
