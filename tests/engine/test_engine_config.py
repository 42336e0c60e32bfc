"""The engine reads the operator's engine.yaml layout and sizes its pools from it."""

from __future__ import annotations

import pytest
import yaml
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.engine_yaml import load_engine_config
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.kv.kv_setup import kvstore_config


def test_operator_engine_yaml_maps_onto_the_config(tmp_path):
    """A key the engine misreads would silently run the wrong policy or slot count."""
    path = tmp_path / "engine.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "tiny", "path": "", "config": {}},
                "max_batch_size": 6,
                "kv_cache_dtype": "fp8_e4m3",
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
    assert config.kv_cache_dtype == "fp8_e4m3"


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


def test_a_bad_kv_cache_dtype_names_the_key_and_the_choices(tmp_path):
    """An fp8 typo must stop the start, not serve a bf16 cache nobody chose."""
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"kv_cache_dtype": "fp8"}))
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        load_engine_config(path)
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of .*fp8_e4m3"):
        EngineConfig(kv_cache_dtype="int8")


def test_the_cli_flag_sets_the_kv_cache_dtype():
    """`--kv-cache-dtype` must reach the config, over the file's value."""
    from kvfleet.services.cli import build_parser
    from kvfleet.services.engine.rank.cli import engine_config_from_args

    parser = build_parser()
    args = parser.parse_args(["engine", "--kv-cache-dtype", "fp8_e4m3"])
    assert engine_config_from_args(args).kv_cache_dtype == "fp8_e4m3"
    assert engine_config_from_args(parser.parse_args(["engine"])).kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["engine", "--kv-cache-dtype", "fp16"])
