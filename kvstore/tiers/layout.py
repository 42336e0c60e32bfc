"""The shape of one page of KV per life cycle: what the device, host and disk tiers store.

No torch here: the fleet simulator sizes tiers and charges copy time from `page_bytes` alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# Bytes per element of the dtypes a KV cache is kept in.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class KVLayout:
    """Per life cycle, the model layers it holds, and the shape of one page of them.

    A page of an attention life cycle `lc` is `[num_layers(lc), 2, page_size, kv_heads,
    head_dim]` (K then V), so one block's bytes are contiguous on host and on disk. A life cycle
    named in `state_bytes` keeps a recurrent state of that many bytes per layer instead: its
    page is `[num_layers(lc), 1, 1, 1, state_bytes / itemsize]` (the same rank, so every tier
    copies it like any page), sized by its own bytes and not by the attention page.
    """

    page_size: int
    kv_heads: int
    head_dim: int
    layers: Mapping[str, tuple[int, ...]]
    dtype: str = "bfloat16"
    state_bytes: Mapping[str, int] = field(default_factory=dict)
    # An fp8 cache's scales (a digest of them; "" for none or all 1): pages hold `x / scale`,
    # so pages written under other scales are other values.
    scales_tag: str = ""
    _layer_slot: dict[int, tuple[str, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = (self.page_size, self.kv_heads, self.head_dim)
        if min(sizes) <= 0:
            raise ValueError(f"page_size, kv_heads, head_dim must be positive, got {sizes}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype {self.dtype!r} unknown; known: {sorted(DTYPE_BYTES)}")
        slots: dict[int, tuple[str, int]] = {}
        for name, layer_ids in self.layers.items():
            if not _NAME.match(name):
                raise ValueError(f"life cycle name {name!r} must match {_NAME.pattern}")
            for index, layer in enumerate(layer_ids):
                if layer in slots:
                    raise ValueError(f"layer {layer} is in {slots[layer][0]!r} and {name!r}")
                slots[layer] = (name, index)
        itemsize = DTYPE_BYTES[self.dtype]
        for name, size in self.state_bytes.items():
            if name not in self.layers or size <= 0 or size % itemsize:
                raise ValueError(
                    f"state_bytes[{name!r}] = {size}: must name a life cycle of "
                    f"{sorted(self.layers)} and be a positive multiple of {itemsize} ({self.dtype})"
                )
        object.__setattr__(self, "layers", {k: tuple(v) for k, v in self.layers.items()})
        object.__setattr__(self, "state_bytes", dict(self.state_bytes))
        object.__setattr__(self, "_layer_slot", slots)

    def page_shape(self, life_cycle: str) -> tuple[int, int, int, int, int]:
        """`(layers, 2, page_size, kv_heads, head_dim)` of one page of `life_cycle`, or
        `(layers, 1, 1, 1, elements)` of a state life cycle's page."""
        num_layers = len(self.layers[life_cycle])
        state = self.state_bytes.get(life_cycle)
        if state is not None:
            return (num_layers, 1, 1, 1, state // DTYPE_BYTES[self.dtype])
        return (num_layers, 2, self.page_size, self.kv_heads, self.head_dim)

    def page_bytes(self, life_cycle: str) -> int:
        """Bytes of one page of `life_cycle` (all its layers, K and V)."""
        count = 1
        for size in self.page_shape(life_cycle):
            count *= size
        return count * DTYPE_BYTES[self.dtype]

    def layer_slot(self, layer: int) -> tuple[str, int]:
        """The life cycle holding `layer` and the layer's index within it."""
        try:
            return self._layer_slot[layer]
        except KeyError:
            raise ValueError(
                f"layer {layer} is in no life cycle of {sorted(self.layers)}"
            ) from None

    def fingerprint(self, life_cycle: str) -> bytes:
        """What a disk file must match to be read as a page of `life_cycle` (shape, dtype and,
        for an fp8 cache with scales other than 1, the scales' tag)."""
        shape = "x".join(str(size) for size in self.page_shape(life_cycle))
        scales = f"/scales-{self.scales_tag}" if self.scales_tag else ""
        return f"{life_cycle}/{shape}/{self.dtype}{scales}".encode()
