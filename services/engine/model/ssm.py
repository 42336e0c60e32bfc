"""A Mamba-2-style selective state-space layer in plain torch: a reference recurrent scan.

Per token t (heads H of width P, state size N, one B/C group):

    xBC_t = silu(causal_conv(xBC)_t)                 conv over the last K inputs (conv state)
    dt_t  = softplus(dt_t + dt_bias)                 [H]
    h_t   = exp(dt_t * A) * h_{t-1} + dt_t * x_t B_t^T   [H, P, N]  (A = -exp(A_log))
    y_t   = h_t C_t + D * x_t, gated by silu(z_t), RMS-normed, then out_proj

The recurrent state after token t is `(conv [K-1, conv_dim], ssm [H, P, N])`; resuming from it
equals recomputing the prefix, which is what the `state` life cycle's snapshots rely on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .layers import RMSNorm
from .ssd_scan import causal_conv, chunk_scan
from .ssm_step import decode_step

if TYPE_CHECKING:
    from ..attention.batch import StateRows
    from ..config.model_config import ModelConfig


@dataclass(frozen=True)
class SSMShape:
    """Dimensions of one selective SSM layer."""

    hidden_size: int
    num_heads: int = 4
    head_dim: int = 8
    state_size: int = 8
    conv_kernel: int = 4
    rms_norm_eps: float = 1e-5
    num_groups: int = 1

    def __post_init__(self) -> None:
        if self.num_groups != 1:
            raise ValueError(f"the selective SSM runs one B/C group, got {self.num_groups}")

    @classmethod
    def of(cls, config: ModelConfig) -> SSMShape:
        """The SSM layers' shape of a hybrid model config."""
        return cls(
            hidden_size=config.hidden_size,
            num_heads=config.ssm_num_heads,
            head_dim=config.ssm_head_dim,
            state_size=config.ssm_state_size,
            conv_kernel=config.ssm_conv_kernel,
            rms_norm_eps=config.rms_norm_eps,
            num_groups=config.ssm_num_groups,
        )

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.state_size

    @property
    def state_dims(self) -> tuple[int, int, int]:
        """The SSM state's shape: [heads, head_dim, state_size]."""
        return (self.num_heads, self.head_dim, self.state_size)

    @property
    def state_numel(self) -> int:
        """Floats of one layer's recurrent state (conv window plus SSM state)."""
        conv = (self.conv_kernel - 1) * self.conv_dim
        return conv + self.num_heads * self.head_dim * self.state_size


class StateShape(Protocol):
    """What a recurrent layer's state is made of (`SSMShape`, `gated_delta.DeltaShape`)."""

    conv_kernel: int

    @property
    def conv_dim(self) -> int: ...

    @property
    def state_dims(self) -> tuple[int, ...]: ...

    @property
    def state_numel(self) -> int: ...


@dataclass
class SSMState:
    """One layer's recurrent state after some token (zeros before the first): the conv window
    and the recurrent state of `shape.state_dims` (a Mamba layer's or a gated delta layer's)."""

    conv: torch.Tensor  # [K-1, conv_dim]
    ssm: torch.Tensor  # shape.state_dims: [H, P, N] for the selective SSM

    @classmethod
    def zeros(cls, shape: StateShape, device: torch.device | str = "cpu") -> SSMState:
        conv = torch.zeros(shape.conv_kernel - 1, shape.conv_dim, device=device)
        return cls(conv, torch.zeros(shape.state_dims, device=device))

    def flat(self) -> torch.Tensor:
        """The state as one fp32 vector (`SSMShape.state_numel` floats)."""
        return torch.cat([self.conv.flatten(), self.ssm.flatten()]).float()

    @classmethod
    def from_flat(cls, shape: StateShape, flat: torch.Tensor) -> SSMState:
        split = (shape.conv_kernel - 1) * shape.conv_dim
        conv = flat[:split].reshape(shape.conv_kernel - 1, shape.conv_dim).clone()
        ssm = flat[split : shape.state_numel]
        return cls(conv, ssm.reshape(shape.state_dims).clone())


class SelectiveSSM(nn.Module):
    """Mamba-2 mixer (one group, gated RMSNorm); `forward` scans token by token."""

    def __init__(self, shape: SSMShape) -> None:
        super().__init__()
        self.shape = shape
        h, inner, heads = shape.hidden_size, shape.inner, shape.num_heads
        self.in_proj = nn.Linear(h, inner + shape.conv_dim + heads, bias=False)
        self.conv_weight = nn.Parameter(torch.randn(shape.conv_dim, shape.conv_kernel) * 0.3)
        self.conv_bias = nn.Parameter(torch.zeros(shape.conv_dim))
        self.dt_bias = nn.Parameter(torch.empty(heads))
        self.A_log = nn.Parameter(torch.empty(heads))
        self.D = nn.Parameter(torch.empty(heads))
        self.norm = RMSNorm(inner, shape.rms_norm_eps)  # gated: applied to y * silu(z)
        self.out_proj = nn.Linear(inner, h, bias=False)
        self.reset_dynamics()

    @torch.no_grad()
    def reset_dynamics(self) -> None:
        """Mamba-2's starting values: dt log-spaced over [0.001, 0.1] across heads (some heads
        remember hundreds of tokens), decay rates A in [1, 16], skip D = 1."""
        heads = self.shape.num_heads
        dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), heads))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        self.A_log.copy_(torch.log(torch.linspace(1.0, 16.0, heads)))
        self.D.fill_(1.0)

    def decode(self, x: torch.Tensor, states: torch.Tensor, rows: StateRows) -> torch.Tensor:
        """One token per row, every row at once, from and into the state pages (`ssm_step.py`)."""
        return decode_step(self, x, states, rows)

    def forward(
        self,
        x: torch.Tensor,
        state: SSMState,
        keep_after: frozenset[int] = frozenset(),
        chunked: bool | None = None,
    ) -> tuple[torch.Tensor, SSMState, dict[int, SSMState]]:
        """Outputs `[T, hidden]` of tokens `x [T, hidden]` from `state`; the state after the
        last token, and after each token index in `keep_after` (the snapshots to store).

        `chunked` (default: when T > 1) runs the chunked scan (`ssd_scan.py`), else the
        token-by-token recurrence (a decode step, and the reference the chunked scan equals).
        """
        s = self.shape
        z, xbc, dt = self.in_proj(x).float().split([s.inner, s.conv_dim, s.num_heads], dim=-1)
        dt = F.softplus(dt + self.dt_bias)
        chunked = x.shape[0] > 1 if chunked is None else chunked
        scan = self._scan_chunked if chunked else self._scan_tokens
        y, final, kept = scan(xbc, dt, state, keep_after)
        y = self.norm(y * F.silu(z))
        return self.out_proj(y.to(x.dtype)), final, kept

    def _scan_tokens(
        self, xbc: torch.Tensor, dt: torch.Tensor, state: SSMState, keep_after: frozenset[int]
    ) -> tuple[torch.Tensor, SSMState, dict[int, SSMState]]:
        """The recurrence, one token at a time: outputs `[T, inner]` before the gate."""
        s = self.shape
        decay_rate = -torch.exp(self.A_log.float())
        conv, ssm = state.conv.clone(), state.ssm.clone()
        outputs, kept = [], {}
        for t in range(xbc.shape[0]):
            window = torch.cat([conv, xbc[t : t + 1]])  # [K, conv_dim], oldest first
            conv = window[1:]
            mixed = F.silu((window.T * self.conv_weight).sum(-1) + self.conv_bias)
            xt, b, c = mixed.split([s.inner, s.state_size, s.state_size])
            xt = xt.view(s.num_heads, s.head_dim)
            decay = torch.exp(dt[t] * decay_rate)[:, None, None]
            ssm = decay * ssm + dt[t][:, None, None] * xt[:, :, None] * b[None, None, :]
            outputs.append(((ssm @ c) + self.D[:, None] * xt).flatten())
            if t in keep_after:
                kept[t] = SSMState(conv.clone(), ssm.clone())
        return torch.stack(outputs), SSMState(conv, ssm), kept

    def _scan_chunked(
        self, xbc: torch.Tensor, dt: torch.Tensor, state: SSMState, keep_after: frozenset[int]
    ) -> tuple[torch.Tensor, SSMState, dict[int, SSMState]]:
        """The same outputs and states by the chunked (SSD) scan."""
        s, count = self.shape, xbc.shape[0]
        mixed, window = causal_conv(state.conv, xbc, self.conv_weight, self.conv_bias)
        xs, b, c = mixed.split([s.inner, s.state_size, s.state_size], dim=-1)
        xs = xs.reshape(count, s.num_heads, s.head_dim)
        decay_rate = -torch.exp(self.A_log.float())
        y, end, states = chunk_scan(xs, b, c, dt, decay_rate, self.D.float(), state.ssm, keep_after)
        tail = s.conv_kernel - 1

        def conv_after(stop: int) -> torch.Tensor:  # the last K-1 inputs up to token stop-1
            return window[stop : stop + tail].clone()

        kept = {t: SSMState(conv_after(t + 1), h) for t, h in states.items()}
        return y.reshape(count, s.inner), SSMState(conv_after(count), end), kept
