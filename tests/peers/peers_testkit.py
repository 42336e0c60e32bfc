"""Small sim-backend engines and a weightless model directory for the peer-router tests."""

from __future__ import annotations

from pathlib import Path

from kvfleet.services.engine.config import preset
from kvfleet.services.engine.engine_config import EngineConfig
from kvfleet.services.engine.model_dir import write_model_dir

# Small pools, a short step budget (chunked prefill), no sleeping unless a test asks for it.
SIM_CONFIG = EngineConfig(
    model="tiny",
    compute_backend="sim",
    sim_time_scale=0.0,
    max_batch_size=4,
    max_num_batched_tokens=48,
    page_size=16,
    kv_pages=160,
    checkpoint_margin_tokens=32,
)


def tiny_model_dir(root: Path) -> Path:
    """config.json (the tiny preset) and the byte tokenizer.json under `root/model`."""
    return write_model_dir(root / "model", preset("tiny"))
