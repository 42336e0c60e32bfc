"""The engine as a TP-2 rank on CPU (gloo): worker 0 runs the scheduler and the kvstore and
sends each step and each tier copy to worker 1; a conversation whose prefix went to the host
tier and back gets TP-1's greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from kvfleet.services.engine.compute.backends import TorchCompute
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.kv.kv_setup import disk_tier_root
from kvfleet.services.engine.model.tiny_checkpoint import write_tiny_checkpoint
from tp_engine_run import PAGE, engine_config, serve_conversation
from tp_testkit import run_workers

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

SCRIPT = Path(__file__).with_name("tp_engine_run.py")


def test_tp2_engine_matches_tp1_after_host_onboard(tmp_path: Path) -> None:
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", "Qwen2ForCausalLM", dtype="float32")
    config = engine_config(str(checkpoint), 1)
    core = EngineCore(config, compute=TorchCompute(config)).start()
    try:
        expected = serve_conversation(core)
    finally:
        core.stop()
    assert expected["host_hits"] >= 1 and expected["cached_tokens"] >= PAGE
    out = tmp_path / "tp2.json"
    run_workers(SCRIPT, 2, tmp_path, f"--checkpoint={checkpoint}", f"--out={out}")
    got = json.loads(out.read_text())
    assert got["host_hits"] == expected["host_hits"]
    assert got["cached_tokens"] == expected["cached_tokens"]
    assert got["turn_one"] == expected["turn_one"]
    assert got["turn_two"] == expected["turn_two"]


def test_disk_blocks_of_another_layout_are_elsewhere() -> None:
    model = SimpleNamespace(name="m")
    base = EngineConfig(model_path="/models/m", disk_tier_dir="/disk", disk_tier_enabled=False)
    tp1 = disk_tier_root(model, base)
    tp2 = disk_tier_root(model, base.with_changes(tensor_parallel=2))
    assert tp1 != tp2 and tp2.startswith(tp1)


def test_tensor_parallel_needs_a_checkpoint_and_no_disk_tier() -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel=2 needs .*model_path"):
        EngineConfig(tensor_parallel=2)
    with pytest.raises(ValueError, match=r"tensor_parallel=2 needs .*disk_tier_enabled false"):
        EngineConfig(tensor_parallel=2, model_path="/m", disk_tier_dir="/disk")
    with pytest.raises(ValueError, match=r"tensor_parallel=2 needs .*role 'both'"):
        EngineConfig(tensor_parallel=2, model_path="/m", role="context")
    with pytest.raises(ValueError, match="tensor_parallel must be >= 1"):
        EngineConfig(tensor_parallel=0)


def test_engine_yaml_sets_tensor_parallel() -> None:
    data = {"model": {"path": "/m"}, "tensor_parallel": 2}
    assert engine_config_from_dict(data).tensor_parallel == 2
    with pytest.raises(ValueError, match="tensor_parallel"):
        engine_config_from_dict({"tensor_parallel": 0})
