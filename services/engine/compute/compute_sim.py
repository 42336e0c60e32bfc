"""The `sim` compute backend: the cost model's step time on the wall clock, no tensors.

The scheduler, the kvstore manager and its tiers run exactly as with `torch`; only the forward
is replaced. Each step sleeps for `CostModel.step_seconds` of what the step computes (prefill
spans with their attention term, one token per decoding sequence, pages onboarded from host or
disk since the last step) times `sim_time_scale`, then returns deterministic tokens. So an
engine rank with this backend serves the same gRPC and HTTP APIs with realistic timing and real
prefix reuse, and any router can front a simulated fleet on a CPU machine.

| figure             | comes from                                                        |
|--------------------|-------------------------------------------------------------------|
| model shape        | the engine's model (preset or `model_path/config.json`)            |
| hardware           | `hardware:` of `sim_costs_path` (default: the packaged sim_costs.yaml) |
| block (page) size  | the engine's `page_size`                                           |
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import xxhash

from ....kvstore.tiers.build import build_tiers
from ....kvstore.tiers.stack import KVTiers
from ...core.cost_figures import ModelShape, load_hardware
from ...core.cost_model import CostModel
from ..config.engine_config import EngineConfig
from ..config.model_config import ModelConfig
from ..kv.kv_setup import kv_layout, kvstore_config, tier_config
from ..request.scheduled_chunk import ScheduledChunk
from .compute_types import resolve_model_config
from .step_work import OnboardedPages, step_work

# Sampled ids are printable ASCII bytes when the vocabulary has them: readable text through the
# byte tokenizer, and never a special (stop) token, so outputs run to max_tokens.
PRINTABLE_IDS = range(32, 127)
# The simulated accelerator's weights; its pages are in `kv_cache_dtype` of these (sizes the
# host/disk tiers).
KV_DTYPE = torch.bfloat16


def cost_shape(model: ModelConfig) -> ModelShape:
    """The cost model's view of an engine model (bf16 weights and KV)."""
    return ModelShape(
        name=model.name,
        params_billion=model.num_parameters() / 1e9,
        layers=model.num_layers,
        query_heads=model.num_heads,
        kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        dtype_bytes=2,
    )


class SimCompute:
    """Cost-model timing over byte-less KV tiers; one per engine core."""

    name = "sim"

    def __init__(self, config: EngineConfig, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self.model_config = resolve_model_config(config)
        self.store_config = kvstore_config(self.model_config, config)
        path = Path(config.sim_costs_path) if config.sim_costs_path else None
        hardware = load_hardware(path)
        self.costs = CostModel.from_figures(
            cost_shape(self.model_config), hardware, config.page_size
        )
        self.time_scale = config.sim_time_scale
        self.simulated_seconds = 0.0  # every step's cost-model time, before scaling
        self._sleep = sleep
        self._onboarded = OnboardedPages()
        self._vocab = self.model_config.vocab_size
        self._ids = PRINTABLE_IDS if self._vocab > PRINTABLE_IDS.stop else range(self._vocab)

    def open_tiers(self) -> KVTiers:
        """Byte-less tiers with the host/disk page counts a torch rank would have; with a
        disk folder, ranks share its marker files (a block's contents, no payload) as torch
        ranks share block files.
        """
        layout = kv_layout(self.model_config, self.config, KV_DTYPE)
        planned = tier_config(self.model_config, self.config, self.store_config, layout)
        tiers = build_tiers(self.store_config, planned)
        self._onboarded.watch(tiers.metrics)
        return tiers

    def execute(self, chunks: Sequence[ScheduledChunk]) -> list[int | None]:
        """Sleep for the step's cost-model time; a token for each chunk that samples."""
        host, disk = self._onboarded.since_last()
        seconds = self.costs.step_seconds(step_work(chunks, host, disk))
        self.simulated_seconds += seconds
        if seconds * self.time_scale > 0:
            self._sleep(seconds * self.time_scale)
        return [self.token_for(chunk) if chunk.samples else None for chunk in chunks]

    def token_for(self, chunk: ScheduledChunk) -> int:
        """A token fixed by the seed, the sequence's length and its last token."""
        sequence = chunk.sequence
        seed = self.config.seed if sequence.sampling.seed is None else sequence.sampling.seed
        last = chunk.new_tokens[-1] if chunk.new_tokens else 0
        key = f"{sequence.sample_index}:{sequence.num_tokens}:{last}".encode()
        return self._ids[xxhash.xxh64_intdigest(key, seed=seed & (2**64 - 1)) % len(self._ids)]
