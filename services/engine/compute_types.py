"""What a compute backend is, and the model shape every backend resolves the same way.

The registry (`compute.py`) and its members (`TorchCompute` there, `SimCompute` in
`compute_sim.py`) import these; no member imports the registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.tiers.stack import KVTiers

from .config import ModelConfig, preset
from .engine_config import EngineConfig
from .scheduler import ScheduledChunk
from .weights import config_from_file

if TYPE_CHECKING:
    from .sampling import RowResult


class ComputeBackend(Protocol):
    """Runs one step; owns the model and the K/V bytes (never the page tables)."""

    name: str
    model_config: ModelConfig
    store_config: KVStoreConfig

    def execute(self, chunks: Sequence[ScheduledChunk]) -> list[RowResult | None]:
        """Run `chunks` as one batch; for each chunk that samples a token (int), a
        SampledToken (logprobs asked) or a SampleFailure (that sequence alone fails), else None."""
        ...

    def open_tiers(self) -> KVTiers | None:
        """KV tiers for a new manager (None: the manager's device-only default)."""
        ...


def resolve_model_config(config: EngineConfig) -> ModelConfig:
    """The model's shape: from the checkpoint's config.json, else the named preset; a
    `max_model_len` caps its context (so the KV pools are sized for that, not the maximum)."""
    if config.model_path:
        shape = config_from_file(f"{config.model_path}/config.json")
    else:
        shape = preset(config.model)
    if config.max_model_len and config.max_model_len < shape.max_position:
        shape = dataclasses.replace(shape, max_position=config.max_model_len)
    return shape
