"""Qwen3-Next's linear attention layer (`linear_attn`): a gated delta rule over a causal conv.

Per token (Hk key heads of width dk, Hv value heads of width dv, each key head serving
Hv / Hk value heads):

    q, k, v, z = in_proj_qkvz(x)   (grouped per key head: [q, k, v of its value heads, z ...])
    b, a       = in_proj_ba(x)     (likewise: [b ..., a ...] per key head)
    q, k, v    = silu(causal_conv(q | k | v))        conv over the last K inputs, no bias
    q, k       = l2-normalised, q scaled by 1/sqrt(dk), repeated over each key head's value heads
    beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)
    o          = the gated delta rule (`delta_rule.py`) from the state [Hv, dk, dv]
    out_proj(RMSNorm_per_head(o) * silu(z))

The layer's recurrent state is `(conv [K-1, conv_dim], state [Hv, dk, dv])`, stored in the
`ssm` state pages exactly like a Mamba layer's (`SSMState`, `paged_ssm.py`): `forward` scans a
chunk from a state (the chunked form, or token by token as the reference), `decode` steps every
decoding row at once from its page into its page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .delta_rule import chunk_delta_rule, delta_rule_step
from .fused import fusable
from .layers import RMSNorm
from .ssd_scan import causal_conv
from .ssm import SSMState

if TYPE_CHECKING:
    from ..attention.batch import StateRows
    from ..config.model_config import ModelConfig


@dataclass(frozen=True)
class DeltaShape:
    """Dimensions of one gated delta layer."""

    hidden_size: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int = 4
    rms_norm_eps: float = 1e-6

    @classmethod
    def of(cls, config: ModelConfig) -> DeltaShape:
        """The linear attention layers' shape: the config's SSM fields, read as value heads
        (`ssm_num_heads` of `ssm_head_dim`) and key heads (`ssm_num_groups` of
        `ssm_state_size`), so that `ssm_state_floats` sizes its state pages."""
        return cls(
            hidden_size=config.hidden_size,
            key_heads=config.ssm_num_groups,
            value_heads=config.ssm_num_heads,
            key_dim=config.ssm_state_size,
            value_dim=config.ssm_head_dim,
            conv_kernel=config.ssm_conv_kernel,
            rms_norm_eps=config.rms_norm_eps,
        )

    @property
    def key_width(self) -> int:
        return self.key_heads * self.key_dim

    @property
    def value_width(self) -> int:
        return self.value_heads * self.value_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q and k of every key head, v of every value head."""
        return 2 * self.key_width + self.value_width

    @property
    def state_dims(self) -> tuple[int, int, int]:
        return (self.value_heads, self.key_dim, self.value_dim)

    @property
    def state_numel(self) -> int:
        """Floats of one layer's recurrent state (conv window plus the delta rule's state)."""
        return (self.conv_kernel - 1) * self.conv_dim + self.value_width * self.key_dim


class GatedDeltaNet(nn.Module):
    """The `linear_attn` mixer, its parameters named as the checkpoints name them (the conv's
    `conv1d.weight [C, 1, K]` loads into `conv_weight [C, K]`)."""

    def __init__(self, shape: DeltaShape) -> None:
        super().__init__()
        self.shape = s = shape
        self.in_proj_qkvz = nn.Linear(s.hidden_size, 2 * s.key_width + 2 * s.value_width, False)
        self.in_proj_ba = nn.Linear(s.hidden_size, 2 * s.value_heads, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(s.conv_dim, s.conv_kernel))
        self.dt_bias = nn.Parameter(torch.empty(s.value_heads))
        self.A_log = nn.Parameter(torch.empty(s.value_heads))
        self.norm = RMSNorm(s.value_dim, s.rms_norm_eps)  # per head, then gated by silu(z)
        self.out_proj = nn.Linear(s.value_width, s.hidden_size, bias=False)

    @torch.no_grad()
    def reset_dynamics(self) -> None:
        """transformers' starting values: dt_bias 1, decay rates A spread over [1, 16]."""
        self.dt_bias.fill_(1.0)
        self.A_log.copy_(torch.log(torch.linspace(1.0, 16.0, self.shape.value_heads)))

    def forward(
        self,
        x: torch.Tensor,
        state: SSMState,
        keep_after: frozenset[int] = frozenset(),
        chunked: bool | None = None,
    ) -> tuple[torch.Tensor, SSMState, dict[int, SSMState]]:
        """Outputs `[T, hidden]` of tokens `x [T, hidden]` from `state`; the state after the
        last token, and after each token index in `keep_after` (the snapshots to store).
        `chunked` (default: when T > 1) runs the chunked form, else the recurrence."""
        s, count = self.shape, x.shape[0]
        mixed, z, b, a = self._project(x)
        conv, window = causal_conv(state.conv, mixed.float(), self.conv_weight.float())
        q, k, v = heads(conv.to(x.dtype), s)
        g, beta = gates(b, a, self.A_log, self.dt_bias)
        chunked = count > 1 if chunked is None else chunked
        if chunked:
            o, end, states = chunk_delta_rule(q, k, v, g, beta, state.ssm, keep_after)
        else:
            o, end, states = _token_by_token(q, k, v, g, beta, state.ssm, keep_after)
        tail = s.conv_kernel - 1

        def conv_after(stop: int) -> torch.Tensor:  # the last K-1 inputs up to token stop-1
            return window[stop : stop + tail].clone()

        kept = {t: SSMState(conv_after(t + 1), h) for t, h in states.items()}
        return self._output(o, z, x.dtype), SSMState(conv_after(count), end), kept

    def decode(self, x: torch.Tensor, states: torch.Tensor, rows: StateRows) -> torch.Tensor:
        """One token per row `x [B, hidden]`, every row at once: row b's state moves from page
        `rows.read[b]` to page `rows.write[b]` of `states` (`[num_pages, floats]`, fp32), as
        `ssm_step.decode_step` does for a Mamba layer."""
        s = self.shape
        mixed, z, b, a = self._project(x)
        o, after = step_update(
            states, rows.read, rows.keep, mixed, b, a, self.conv_weight, self.A_log, self.dt_bias, s
        )
        states[:, : s.state_numel].index_copy_(0, rows.write, after)
        return self._output(o, z, x.dtype)

    def _project(self, x: torch.Tensor):
        """(q | k | v conv input `[T, conv_dim]`, z `[T, Hv, dv]`, b and a `[T, Hv]`) out of the
        per-key-head grouped projections."""
        s, count = self.shape, x.shape[0]
        per_key = s.value_heads // s.key_heads
        qkvz = self.in_proj_qkvz(x).view(count, s.key_heads, -1)
        sizes = [s.key_dim, s.key_dim, per_key * s.value_dim, per_key * s.value_dim]
        q, k, v, z = qkvz.split(sizes, dim=-1)
        b, a = self.in_proj_ba(x).view(count, s.key_heads, -1).split([per_key, per_key], dim=-1)
        mixed = torch.cat([t.reshape(count, -1) for t in (q, k, v)], dim=-1)
        z = z.reshape(count, s.value_heads, s.value_dim)
        return mixed, z, b.reshape(count, -1), a.reshape(count, -1)

    def _output(self, o: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """out_proj(norm(o) * silu(z)), normed per value head in the model's dtype."""
        y = self.norm(o.to(dtype)) * F.silu(z.float())
        return self.out_proj(y.to(dtype).flatten(1))


def heads(conv: torch.Tensor, s: DeltaShape):
    """fp32 q, k `[T, Hv, dk]` (unit norm, q scaled by 1/sqrt(dk), each key head repeated over
    its value heads) and v `[T, Hv, dv]` of the conv's output `[T, conv_dim]`."""
    count, per_key = conv.shape[0], s.value_heads // s.key_heads
    q, k, v = conv.float().split([s.key_width, s.key_width, s.value_width], dim=-1)
    q, k = (t.view(count, s.key_heads, s.key_dim) for t in (q, k))
    q, k = _l2norm(q) * s.key_dim**-0.5, _l2norm(k)
    if per_key > 1:
        q, k = q.repeat_interleave(per_key, dim=1), k.repeat_interleave(per_key, dim=1)
    return q, k, v.view(count, s.value_heads, s.value_dim)


def gates(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """(log decay g, write strength beta) `[T, Hv]` in fp32."""
    g = -torch.exp(a_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b).float()


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _token_by_token(q, k, v, g, beta, h0, keep_after):
    """The recurrence, one token at a time (the reference the chunked form equals)."""
    state, outputs, kept = h0, [], {}
    for t in range(q.shape[0]):
        o, state = delta_rule_step(q[t], k[t], v[t], g[t], beta[t], state)
        outputs.append(o)
        if t in keep_after:
            kept[t] = state
    return torch.stack(outputs), state, kept


@fusable
def step_update(
    states: torch.Tensor,
    read: torch.Tensor,
    keep: torch.Tensor | None,
    mixed: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    conv_weight: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    s: DeltaShape,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for every row: outputs `[B, Hv, dv]` and the flat states after it `[B,
    state_numel]` (zeros where `keep` is False, so a padded row leaves the null page zero)."""
    rows = mixed.shape[0]
    split = (s.conv_kernel - 1) * s.conv_dim
    flat = states[read]  # [B, floats]: each row's state, gathered
    conv = flat[:, :split].view(rows, s.conv_kernel - 1, s.conv_dim)
    window = torch.cat([conv, mixed.float()[:, None]], dim=1)  # [B, K, conv_dim], oldest first
    out = F.silu((window.transpose(1, 2) * conv_weight.float()).sum(-1))
    q, k, v = heads(out.to(mixed.dtype), s)
    g, beta = gates(b, a, a_log, dt_bias)
    state = flat[:, split : s.state_numel].view(rows, *s.state_dims)
    o, state = delta_rule_step(q, k, v, g, beta, state)
    after = torch.cat([window[:, 1:].flatten(1), state.flatten(1)], dim=1)
    if keep is not None:
        after = torch.where(keep[:, None], after, 0.0)
    return o, after
