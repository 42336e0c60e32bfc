"""The selective scan in chunks (Mamba-2's SSD form), plain torch: what prefill runs.

For a run of L tokens from state h0, with per-token log decay a_t = dt_t * A and its running
sum S_t = a_1 + ... + a_t (per head):

    y_t   = sum_{s<=t} exp(S_t - S_s) (C_t . B_s) dt_s x_s  +  exp(S_t) h0 C_t  +  D x_t
    h_L   = exp(S_L) h0 + sum_s exp(S_L - S_s) dt_s x_s B_s^T

which is the token-by-token recurrence (`SelectiveSSM`'s reference loop) unrolled. The tokens
are cut into chunks of `chunk_tokens` and every chunk is computed at once, with no loop:

  1. intra-chunk: one masked [L, L] decay matrix per chunk and head, applied as a matmul;
  2. each chunk's own end state (from zero), one batched matmul;
  3. state passing: the state entering chunk c is a decayed sum of h0 and the earlier chunks'
     own states, one [chunks + 1, chunks + 1] decay matrix per head;
  4. the entering state's share of each output, and of each kept state (a block end inside a
     chunk: a snapshot to store), read off the same decay matrices.

Decay sums are taken over exactly the tokens between two points (`segment_sums`), never as a
difference of two long running sums, so a long prompt loses no precision to them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

# Tokens per chunk: intra-chunk work grows with it, the state passing's with the chunk count.
# On CPU (1024 tokens, 16 heads of 64, state 128) 64 and 128 tie and 256 takes 2.5x as long;
# bench/gpu/hybrid_bench.py measures 64 / 128 / 256 on the GPU.
CHUNK_TOKENS = 64


def causal_conv(
    conv_state: torch.Tensor,
    xbc: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(conv) of every token `xbc [T, D]` after `conv_state [K-1, D]`, and the window
    `[T + K - 1, D]` (oldest first) whose rows t+1 .. t+K-1 are the conv state after token t."""
    kernel = weight.shape[1]
    window = torch.cat([conv_state, xbc])
    mixed = (window.unfold(0, kernel, 1) * weight).sum(-1)  # [T, D, K] -> [T, D]
    return F.silu(mixed if bias is None else mixed + bias), window


def chunk_scan(
    x: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    dt: torch.Tensor,
    decay_rate: torch.Tensor,
    skip: torch.Tensor,
    h0: torch.Tensor,
    keep_after: Iterable[int] = (),
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """Outputs `[T, H, P]` of `x [T, H, P]` (with `b, c [T, N]`, `dt [T, H]`, A = `decay_rate
    [H]`, D = `skip [H]`) from state `h0 [H, P, N]`, the state after the last token, and the
    state after each token index in `keep_after`. `chunk_tokens` None: `CHUNK_TOKENS`."""
    count, heads, width = x.shape
    length = min(chunk_tokens or CHUNK_TOKENS, count)
    chunks = -(-count // length)
    pad = chunks * length - count  # pad tokens have dt = 0: no decay, no input, state unchanged
    xs, bs, cs, dts = (F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) for t in (x, b, c, dt))
    xs = xs.view(chunks, length, heads, width)
    bs, cs = bs.view(chunks, length, -1), cs.view(chunks, length, -1)
    log_decay = (dts * decay_rate).view(chunks, length, heads).transpose(1, 2)  # [c, H, L]
    decay = torch.exp(segment_sums(log_decay))  # [c, H, t, s]: exp(S_t - S_s), 0 for s > t
    dt_x = xs * dts.view(chunks, length, heads, 1)  # dt_s x_s [c, L, H, P]
    # 1. intra-chunk outputs
    scores = (cs @ bs.transpose(1, 2))[:, None] * decay  # (C_t . B_s) exp(S_t - S_s) [c,H,t,s]
    y = scores @ dt_x.transpose(1, 2)  # [c, H, L, P]
    # 2. each chunk's own end state: sum_s exp(S_L - S_s) dt_s x_s B_s^T
    to_end = decay[:, :, -1, :, None] * dt_x.transpose(1, 2)  # [c, H, L, P]
    own = to_end.transpose(2, 3) @ bs[:, None]  # [c, H, P, N]
    # 3. state passing: entering[0] = h0, entering[c + 1] = the state after chunk c
    totals = F.pad(log_decay.sum(-1).T, (1, 0))  # [H, c + 1]: chunk c's total decay at c + 1
    passing = torch.exp(segment_sums(totals))  # [H, c + 1, c + 1]
    sources = torch.cat([h0[None], own])  # [c + 1, H, P, N]
    entering = torch.einsum("hij,jhpn->ihpn", passing, sources)
    # 4. the entering state's share of the outputs: exp(S_t) h_in C_t
    start_decay = torch.exp(torch.cumsum(log_decay, dim=-1))  # [c, H, L]
    y = y + start_decay[..., None] * (cs[:, None] @ entering[:-1].transpose(2, 3))
    y = y.transpose(1, 2).reshape(chunks * length, heads, width)[:count]
    kept = _kept_states(keep_after, length, decay, start_decay, dt_x, bs, entering)
    return y + skip[None, :, None] * x, entering[-1], kept


def segment_sums(log_decay: torch.Tensor) -> torch.Tensor:
    """`[..., T, T]` with entry (t, s) = log_decay[s+1] + ... + log_decay[t] for s <= t (0 on
    the diagonal) and -inf above it: a sum over exactly those terms, never S_t - S_s."""
    steps = log_decay.shape[-1]
    repeated = log_decay[..., None, :].expand(*log_decay.shape, steps).transpose(-1, -2)
    below = torch.ones(steps, steps, dtype=torch.bool, device=log_decay.device).tril(-1)
    sums = torch.cumsum(repeated.masked_fill(~below, 0.0), dim=-2)
    causal = torch.ones(steps, steps, dtype=torch.bool, device=log_decay.device).tril()
    return sums.masked_fill(~causal, float("-inf"))


def _kept_states(keep_after, length, decay, start_decay, dt_x, bs, entering):
    """h_t for each kept token t (chunk k, offset i): exp(S_i) h_in[k] plus the chunk's tokens
    up to i, each decayed to i."""
    keep = sorted(set(keep_after))
    if not keep:
        return {}
    index = torch.tensor(keep, device=decay.device)
    chunk, offset = index // length, index % length
    to_t = decay[chunk, :, offset, :, None] * dt_x[chunk].transpose(1, 2)  # [k, H, L, P]
    states = to_t.transpose(2, 3) @ bs[chunk][:, None]  # [k, H, P, N]
    states = states + start_decay[chunk, :, offset][..., None, None] * entering[chunk]
    return dict(zip(keep, states.unbind(0), strict=True))
