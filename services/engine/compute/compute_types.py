"""What a compute backend is, and the model shape every backend resolves the same way.

The registry (`backends.py`) and its members (`TorchCompute` there, `SimCompute` in
`compute_sim.py`) import these; no member imports the registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ....kvstore.config import KVStoreConfig
from ....kvstore.tiers.stack import KVTiers
from ..config.engine_config import EngineConfig
from ..config.model_config import ModelConfig, preset
from ..model.weights import config_from_file
from ..request.scheduled_chunk import ScheduledChunk

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
    """The model's shape: from the checkpoint's config.json, else the named preset; its
    context capped at `max_model_len` when set."""
    if config.model_path:
        model = config_from_file(f"{config.model_path}/config.json")
    else:
        model = preset(config.model)
    if config.max_model_len is None:
        return model
    if config.max_model_len > model.max_position:
        raise ValueError(
            f"max_model_len {config.max_model_len} exceeds the model's context "
            f"({model.max_position} positions)"
        )
    return model.with_changes(max_position=config.max_model_len)
