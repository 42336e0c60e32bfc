"""The gated delta rule (Qwen3-Next's linear attention) in plain torch: one step, and chunks.

Per token t and head, with unit-norm key k_t and query q_t (scaled by 1/sqrt(dk)), value v_t,
log decay g_t <= 0 and write strength beta_t in (0, 1), the state S [dk, dv] moves as

    S_t = exp(g_t) S_{t-1} + k_t d_t^T,   d_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)
    o_t = S_t^T q_t

(the state is decayed, then corrected towards v_t where it mispredicts it). Unrolled over a run
of tokens from S_0, with G_t = g_1 + ... + g_t,

    S_t = exp(G_t) S_0 + sum_{s<=t} exp(G_t - G_s) k_s d_s^T

and the corrections d_s of one run solve one unit lower-triangular system (the WY form of
DeltaNet): d = T^-1 (beta v) - T^-1 (beta exp(G) k) S_0, T = I + strictly_lower(beta k k^T
decayed). `chunk_delta_rule` cuts the tokens into chunks of `CHUNK_TOKENS`, solves every chunk's
system at once, and only passes the state from chunk to chunk in a loop (a matrix recurrence:
a few matmuls per chunk, no per-token loop); the state after any token inside a chunk (a
snapshot to store) is read off the same quantities.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .ssd_scan import segment_sums

# Tokens per chunk, as transformers' and the FLA kernels' chunked form uses.
CHUNK_TOKENS = 64


def delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for every row: `q, k [..., H, dk]`, `v [..., H, dv]`, `g, beta [..., H]`,
    `state [..., H, dk, dv]` -> (output `[..., H, dv]`, the state after the token)."""
    state = state * torch.exp(g)[..., None, None]
    predicted = (state * k[..., None]).sum(-2)
    delta = (v - predicted) * beta[..., None]
    state = state + k[..., None] * delta[..., None, :]
    return (state * q[..., None]).sum(-2), state


def chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    h0: torch.Tensor,
    keep_after: Iterable[int] = (),
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """Outputs `[T, H, dv]` of `q, k [T, H, dk]`, `v [T, H, dv]`, `g, beta [T, H]` (fp32) from
    state `h0 [H, dk, dv]`, the state after the last token, and the state after each token
    index in `keep_after`. `chunk_tokens` None: `CHUNK_TOKENS`."""
    count = q.shape[0]
    length = min(chunk_tokens or CHUNK_TOKENS, count)
    chunks = -(-count // length)
    pad = chunks * length - count  # pad tokens: k = v = 0, beta = g = 0, the state unchanged

    def by_chunk(t: torch.Tensor) -> torch.Tensor:  # [T, H, ...] -> [chunks, H, L, ...]
        t = F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad))
        return t.view(chunks, length, *t.shape[1:]).transpose(1, 2)

    qs, ks, vs, gs, betas = (by_chunk(t) for t in (q, k, v, g, beta))
    decay = torch.exp(segment_sums(gs))  # [c, H, t, s]: exp(G_t - G_s), 0 for s > t
    from_start = torch.exp(torch.cumsum(gs, dim=-1))  # [c, H, L]: exp(G_t)
    k_beta = ks * betas[..., None]
    system = (k_beta @ ks.transpose(-1, -2)) * decay  # its strictly lower part; unit diagonal
    values = torch.linalg.solve_triangular(
        system, vs * betas[..., None], upper=False, unitriangular=True
    )
    reads = torch.linalg.solve_triangular(
        system, k_beta * from_start[..., None], upper=False, unitriangular=True
    )
    to_end = ks * decay[..., -1, :, None]  # k_s exp(G_L - G_s)
    state, entering, corrections = h0, [], []
    for c in range(chunks):  # only the state passes from chunk to chunk
        entering.append(state)
        d = values[c] - reads[c] @ state  # [H, L, dv]
        corrections.append(d)
        state = state * from_start[c, :, -1, None, None] + to_end[c].transpose(-1, -2) @ d
    starts, ds = torch.stack(entering), torch.stack(corrections)  # [c, H, dk, dv], [c, H, L, dv]
    scores = (qs @ ks.transpose(-1, -2)) * decay
    out = (qs * from_start[..., None]) @ starts + scores @ ds  # [c, H, L, dv]
    out = out.transpose(1, 2).reshape(chunks * length, *out.shape[1:2], -1)[:count]
    kept = _kept_states(keep_after, length, decay, from_start, ks, ds, starts)
    return out, state, kept


def _kept_states(keep_after, length, decay, from_start, ks, ds, starts):
    """S_t for each kept token t (chunk c, offset i): exp(G_i) S_in[c] plus the chunk's
    corrections up to i, each decayed to i."""
    keep = sorted(set(keep_after))
    if not keep:
        return {}
    index = torch.tensor(keep, device=decay.device)
    chunk, offset = index // length, index % length
    to_t = ks[chunk] * decay[chunk, :, offset, :, None]  # [n, H, L, dk]
    states = to_t.transpose(-1, -2) @ ds[chunk]
    states = states + from_start[chunk, :, offset][..., None, None] * starts[chunk]
    return dict(zip(keep, states.unbind(0), strict=True))
