"""The engine reads the operator's engine.yaml layout and sizes its pools from it."""

from __future__ import annotations

import pytest
import yaml
from kvfleet.services.engine.config import preset
from kvfleet.services.engine.engine_config import EngineConfig, load_engine_config
from kvfleet.services.engine.kv_setup import kvstore_config


def test_operator_engine_yaml_maps_onto_the_config(tmp_path):
    """A key the engine misreads would silently run the wrong policy or slot count."""
    path = tmp_path / "engine.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "tiny", "path": "", "config": {}},
                "max_batch_size": 6,
                "ranks_per_pod": 1,
                "reuse": {"policy": "per_request", "max_num_turns": 3, "checkpoint": False},
                "kv_tiers": {"disk": {"enabled": True, "dir": "/var/lib/kvfleet/disk"}},
            }
        )
    )
    config = load_engine_config(path)
    assert (config.model, config.max_batch_size, config.reuse_policy) == ("tiny", 6, "per_request")
    assert (config.max_num_turns, config.checkpoint) == (3, False)
    assert config.disk_tier_dir == "/var/lib/kvfleet/disk"


def test_pools_are_sized_for_slots_and_retained_turns():
    """Pools sized for one window per request evict the retained turns under load."""
    config = EngineConfig(max_batch_size=2, max_num_turns=2, page_size=16)
    store = kvstore_config(preset("tiny"), config)
    # full: 2 slots x 256 blocks + 2 conversations x 2 retained turns x 128 blocks (a
    # conversation's turns share its prefix: together one context), plus the null page
    assert store.pool_pages["full"] == 2 * 256 + 4 * 128 + 1
    # 2 turns and the 2 default branch records, which share that context's full prefix too
    assert store.reuse_policy.retained_turns == 2 + 2


def test_bad_values_name_the_field():
    """A config error without the field name sends the operator hunting."""
    with pytest.raises(ValueError, match="max_batch_size"):
        EngineConfig(max_batch_size=0)
    with pytest.raises(ValueError, match="role"):
        EngineConfig(role="decode")
