"""Model shape: one frozen dataclass, and a small registry of named presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FULL_GROUP = "full"
WINDOW_GROUP = "window"


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU.

    `window_layers` lists the layers that use sliding-window attention over the last
    `window_size` positions (the query's own position included); every other layer attends to
    the whole prefix. The two kinds keep KV in separate layer groups (`full`, `window`), so
    that the window group can drop pages that slid out of the window.
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
        bad = [i for i in self.window_layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"window_layers {bad} outside 0..{self.num_layers - 1}")
        if self.window_layers and self.window_size <= 0:
            raise ValueError(f"window_layers need window_size > 0, got {self.window_size}")

    def layer_group(self, layer: int) -> str:
        """Name of the KV layer group that `layer` belongs to."""
        return WINDOW_GROUP if layer in self.window_layers else FULL_GROUP

    def layer_window(self, layer: int) -> int | None:
        """Sliding window of `layer` in positions, or None for full attention."""
        return self.window_size if layer in self.window_layers else None

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
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * self.intermediate_size + 2 * h
        head = 0 if self.tie_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * per_layer + h + head

    def with_changes(self, **changes: Any) -> ModelConfig:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for a checkpoint's config file."""
        data = dataclasses.asdict(self)
        data["window_layers"] = list(self.window_layers)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of `to_dict`; unknown keys are kept in `extra`."""
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        known["window_layers"] = tuple(known.get("window_layers", ()))
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


PRESETS: dict[str, Callable[[], ModelConfig]] = {"tiny": _tiny, "1b": _llama_1b, "8b": _llama_8b}


def preset(name: str) -> ModelConfig:
    """The named preset config (`tiny`, `1b`, `8b`)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None
