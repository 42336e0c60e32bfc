"""Model shape: one frozen dataclass, and a small registry of named presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FULL_GROUP = "full"
WINDOW_GROUP = "window"
STATE_GROUP = "ssm"
ROPE_KINDS = ("linear", "dynamic", "yarn", "llama3")
EXPERT_KINDS = ("swiglu", "gpt_oss")
# Its recurrent layers are gated delta rules (model/gated_delta.py), its attention gated.
GATED_DELTA_ARCHITECTURE = "Qwen3NextForCausalLM"


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE scaling rule, with the parameters Hugging Face defines for each kind.

    `original_max_position` is the pretraining context: llama3 and yarn rescale frequencies
    against it; dynamic NTK starts rescaling past it (each token is rotated with the base of a
    sequence that ends at it, so cached keys never change).
    """

    kind: str
    factor: float
    original_max_position: int = 0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise ValueError(f"rope scaling kind {self.kind!r} unknown; supported: {ROPE_KINDS}")
        if self.kind != "linear" and self.original_max_position <= 0:
            raise ValueError(f"rope scaling {self.kind!r} needs original_max_position > 0")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU or routed experts.

    `window_layers` lists the layers that use sliding-window attention over the last
    `window_size` positions (the query's own position included); every other layer attends to
    the whole prefix. The two kinds keep KV in separate layer groups (`full`, `window`), so
    that the window group can drop pages that slid out of the window.

    Optional parts, each off by default (a Llama 2 shape): biases on q/k/v (`qkv_bias`), on o
    (`o_bias`) and on the MLP (`mlp_bias`); RMSNorm of each q and k head (`qk_norm`); RoPE
    scaling; and mixture-of-experts MLPs in `moe_layers` (`num_experts` SwiGLU experts of
    `moe_intermediate_size`, `num_experts_per_tok` of them per token, their softmax weights
    renormalised over the chosen ones when `norm_topk_prob`).

    `attention_sinks` gives every attention head a learned sink logit (gpt-oss): one more
    column in each query's softmax whose value is never read, so a head can attend to nothing.
    `experts_kind` picks the experts' flavour (their blocks: `layers.MOE_BLOCKS`): `swiglu` (a
    router without bias, SwiGLU experts) or `gpt_oss` (a router with bias, softmax over the
    top-k logits, experts with biases and a SwiGLU clamped at `swiglu_limit` with sigmoid gain
    `swiglu_alpha`).

    Granite's scalars (1.0 / None elsewhere): embeddings times `embedding_multiplier`, each
    residual branch times `residual_multiplier`, logits divided by `logits_scaling`, attention
    scores scaled by `attention_scale` (None: 1/sqrt(head_dim)); `use_rope` False means
    attention without positions (the SSM layers carry them). `rotary_dim` rotates only the first
    that many dims of each head (0: all of them); `shared_expert_intermediate_size` is the width
    of a shared SwiGLU expert beside the routed ones (Qwen3-Next; 0: none).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int = 8192
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    window_layers: tuple[int, ...] = ()
    window_size: int = 0
    init_std: float = 0.02
    name: str = "custom"
    architecture: str = "LlamaForCausalLM"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    rope_scaling: RopeScaling | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: tuple[int, ...] = ()
    experts_kind: str = "swiglu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    attention_sinks: bool = False
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    attention_scale: float | None = None
    use_rope: bool = True
    rotary_dim: int = 0
    shared_expert_intermediate_size: int = 0
    # Hybrid models: these layers are a Mamba-2-style selective SSM (model/ssm.py) of
    # `ssm_num_heads` heads of `ssm_head_dim`, state size `ssm_state_size` and a causal conv
    # of `ssm_conv_kernel` taps; their recurrent state is the `ssm` layer group.
    # `ssm_num_groups` B/C groups (Mamba-2's n_groups; the gated delta rule's key heads), each
    # serving ssm_num_heads / ssm_num_groups heads.
    ssm_layers: tuple[int, ...] = ()
    ssm_num_heads: int = 0
    ssm_head_dim: int = 0
    ssm_state_size: int = 0
    ssm_conv_kernel: int = 4
    ssm_num_groups: int = 1
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads")
        for name in (*positive, "num_kv_heads", "head_dim", "max_position"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.rotary_dim % 2 or not 0 <= self.rotary_dim <= self.head_dim:
            raise ValueError(f"rotary_dim={self.rotary_dim} must be even and at most head_dim")
        for name in ("window_layers", "moe_layers", "ssm_layers"):
            bad = [i for i in getattr(self, name) if not 0 <= i < self.num_layers]
            if bad:
                raise ValueError(f"{name} {bad} outside 0..{self.num_layers - 1}")
        if self.window_layers and self.window_size <= 0:
            raise ValueError(f"window_layers need window_size > 0, got {self.window_size}")
        if self.moe_layers and not (
            0 < self.num_experts_per_tok <= self.num_experts and self.moe_intermediate_size > 0
        ):
            raise ValueError(
                f"moe_layers need 0 < num_experts_per_tok ({self.num_experts_per_tok}) <= "
                f"num_experts ({self.num_experts}) and moe_intermediate_size > 0 "
                f"(got {self.moe_intermediate_size})"
            )
        if self.experts_kind not in EXPERT_KINDS:
            raise ValueError(f"experts_kind {self.experts_kind!r} unknown; known: {EXPERT_KINDS}")
        if self.ssm_layers:
            self._check_ssm()

    def _check_ssm(self) -> None:
        sizes = (self.ssm_num_heads, self.ssm_head_dim, self.ssm_state_size, self.ssm_conv_kernel)
        if min(sizes) <= 0:
            raise ValueError(
                f"ssm_layers need positive ssm_num_heads, ssm_head_dim, ssm_state_size and "
                f"ssm_conv_kernel, got {sizes}"
            )
        if self.ssm_num_groups <= 0 or self.ssm_num_heads % self.ssm_num_groups:
            raise ValueError(
                f"ssm_num_heads={self.ssm_num_heads} is not a multiple of "
                f"ssm_num_groups={self.ssm_num_groups}"
            )
        both = sorted(set(self.ssm_layers) & set(self.window_layers))
        if both:
            raise ValueError(f"layers {both} are in both ssm_layers and window_layers")
        if len(self.ssm_layers) == self.num_layers:
            raise ValueError("a hybrid model needs at least one attention layer")

    def layer_group(self, layer: int) -> str:
        """Name of the KV layer group that `layer` belongs to."""
        if layer in self.ssm_layers:
            return STATE_GROUP
        return WINDOW_GROUP if layer in self.window_layers else FULL_GROUP

    def is_ssm_layer(self, layer: int) -> bool:
        """Whether `layer`'s mixer is the selective SSM (else attention)."""
        return layer in self.ssm_layers

    @property
    def ssm_inner(self) -> int:
        return self.ssm_num_heads * self.ssm_head_dim

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the causal conv: x, and B and C of each group."""
        return self.ssm_inner + 2 * self.ssm_num_groups * self.ssm_state_size

    @property
    def ssm_state_floats(self) -> int:
        """fp32 values of one SSM layer's recurrent state: conv window plus SSM state."""
        conv = (self.ssm_conv_kernel - 1) * self.ssm_conv_dim
        return conv + self.ssm_inner * self.ssm_state_size

    def layer_window(self, layer: int) -> int | None:
        """Sliding window of `layer` in positions, or None for full attention."""
        return self.window_size if layer in self.window_layers else None

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer`'s MLP is the routed experts (else one dense SwiGLU)."""
        return layer in self.moe_layers

    @property
    def groups(self) -> dict[str, tuple[int, ...]]:
        """Layer ids of each non-empty layer group, in layer order."""
        out: dict[str, tuple[int, ...]] = {}
        for layer in range(self.num_layers):
            group = self.layer_group(layer)
            out[group] = (*out.get(group, ()), layer)
        return out

    def num_parameters(self) -> int:
        """Number of weights, embeddings included."""
        h, q, kv = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        attention = h * (q + 2 * kv) + q * h
        attention += (q + 2 * kv) * self.qkv_bias + h * self.o_bias
        attention += 2 * self.head_dim * self.qk_norm + self.num_heads * self.attention_sinks
        dense = 3 * h * self.intermediate_size + (2 * self.intermediate_size + h) * self.mlp_bias
        experts = self.num_experts * (3 * h * self.moe_intermediate_size + h)
        if self.experts_kind == "gpt_oss":  # expert biases, router bias
            experts += self.num_experts * (2 * self.moe_intermediate_size + h + 1)
        experts += 3 * h * self.shared_expert_intermediate_size  # the shared expert
        experts += h if self.shared_expert_intermediate_size else 0  # its gate
        moe = len(self.moe_layers)
        ssm = len(self.ssm_layers)
        inner, heads, conv = self.ssm_inner, self.ssm_num_heads, self.ssm_conv_dim
        mixer = h * (inner + conv + heads) + conv * (self.ssm_conv_kernel + 1) + 3 * heads
        mixer += inner + inner * h  # gated norm, out_proj
        if self.architecture == GATED_DELTA_ARCHITECTURE:
            attention += (h + self.qkv_bias) * q  # q_proj's output gate rows
            # b and a (2 per head) for dt, no conv bias, no D, a norm per head
            mixer += h * heads - conv - heads - inner + self.ssm_head_dim
        layers = (self.num_layers - ssm) * attention + ssm * mixer
        layers += self.num_layers * 2 * h + moe * experts + (self.num_layers - moe) * dense
        head = 0 if self.tie_embeddings else self.vocab_size * h
        return self.vocab_size * h + layers + h + head

    def with_changes(self, **changes: Any) -> ModelConfig:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for a checkpoint's config file."""
        data = dataclasses.asdict(self)
        data["window_layers"] = list(self.window_layers)
        data["moe_layers"] = list(self.moe_layers)
        data["ssm_layers"] = list(self.ssm_layers)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of `to_dict`; unknown keys are kept in `extra`."""
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        known["window_layers"] = tuple(known.get("window_layers", ()))
        known["moe_layers"] = tuple(known.get("moe_layers", ()))
        known["ssm_layers"] = tuple(known.get("ssm_layers", ()))
        if isinstance(known.get("rope_scaling"), dict):
            known["rope_scaling"] = RopeScaling(**known["rope_scaling"])
        extra = {**known.pop("extra", {}), **{k: v for k, v in data.items() if k not in names}}
        return cls(**known, extra=extra)


def _tiny() -> ModelConfig:
    # Byte vocab (256 bytes + specials, padded to 320); one window layer so that CPU tests and
    # `kvfleet up` exercise both layer groups.
    return ModelConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position=4096,
        window_layers=(1,),
        window_size=64,
        name="tiny",
    )


def _llama_1b() -> ModelConfig:
    # Llama-3.2-1B shape.
    return ModelConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        max_position=131072,
        rope_theta=500000.0,
        tie_embeddings=True,
        name="1b",
    )


def _llama_8b() -> ModelConfig:
    # Llama-3.1-8B shape.
    return ModelConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position=131072,
        rope_theta=500000.0,
        name="8b",
    )


def _hybrid_tiny() -> ModelConfig:
    # Four layers, SSM at 0 and 2, full attention at 1 and 3; the tiny preset's byte vocab.
    # Weights ten times the default spread: the SSM layers then move the logits as much as
    # attention does, so a wrong state shows in greedy tokens instead of vanishing in the noise.
    return ModelConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position=4096,
        ssm_layers=(0, 2),
        ssm_num_heads=4,
        ssm_head_dim=8,
        ssm_state_size=8,
        init_std=0.2,
        name="hybrid-tiny",
        architecture="HybridSSMForCausalLM",
    )


def _hybrid_8b() -> ModelConfig:
    # Llama-3-8B widths, three SSM layers (Mamba-2 sizes: 64 heads of 64, state 128) to each
    # attention layer.
    return _llama_8b().with_changes(
        max_position=32768,
        ssm_layers=tuple(i for i in range(32) if i % 4 != 3),
        ssm_num_heads=64,
        ssm_head_dim=64,
        ssm_state_size=128,
        name="hybrid-8b",
        architecture="HybridSSMForCausalLM",
    )


def _hybrid_small() -> ModelConfig:
    # The hybrid-8b structure (eight layers: three SSM to each attention layer, a state page
    # larger than an attention page) at tiny widths: CPU tests and the GPU bench's --small run.
    return _hybrid_tiny().with_changes(
        num_layers=8,
        ssm_layers=tuple(i for i in range(8) if i % 4 != 3),
        ssm_num_heads=8,
        ssm_head_dim=16,
        ssm_state_size=16,
        name="hybrid-small",
    )


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "tiny": _tiny,
    "1b": _llama_1b,
    "8b": _llama_8b,
    "hybrid-tiny": _hybrid_tiny,
    "hybrid-8b": _hybrid_8b,
    "hybrid-small": _hybrid_small,
}


def preset(name: str) -> ModelConfig:
    """The named preset config (`tiny`, `1b`, `8b`, `hybrid-tiny`, `hybrid-8b`,
    `hybrid-small`)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None
