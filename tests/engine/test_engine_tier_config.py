"""engine.yaml / flags -> KV tier sizes, the disk folder and the model's view of device KV."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle
from kvfleet.kvstore.sizing import TypicalStep
from kvfleet.kvstore.tiers.layout import KVLayout
from kvfleet.services.engine.compute.backends import resolve_model_config
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict
from kvfleet.services.engine.kv.kv_setup import (
    GIB,
    build_kv,
    disk_tier_root,
    open_kv_tiers,
    tier_config,
    tier_pages,
    typical_step,
)
from kvfleet.services.engine.rank.cli import engine_config_from_args

# full: 2 layers -> 2 * 2 * 16 * 2 * 8 * 4 = 4096 bytes a page; window: 1 layer -> 2048.
LAYOUT = KVLayout(
    page_size=16, kv_heads=2, head_dim=8, layers={"full": (0, 2), "window": (1,)}, dtype="float32"
)


STEP = TypicalStep(2, 256, 32, retained_turns=4, full_tokens_per_retained_turn=128)
CYCLES = (FullLifeCycle("full"), WindowLifeCycle("window", 32, replay_tokens=16))


def test_tier_pages_split_bytes_for_what_the_tier_holds():
    """A tier sized by page counts would starve the life cycle with bigger pages, and one
    split like the device would keep resident windows it never holds out of the full pool."""
    # one conversation at half the longest context: full 128 / 16 = 8 pages x 4096 bytes,
    # window (1 + ckpt) x 2 pages x 2048
    pages = tier_pages(8 * 4096 + 4 * 2048, STEP, CYCLES, LAYOUT)
    assert pages == {"full": 8, "window": 4}


def test_tier_pages_of_no_budget_are_zero():
    """A zero budget must mean no tier, not a division by zero."""
    assert tier_pages(0, STEP, CYCLES, LAYOUT) == {"full": 0, "window": 0}


def test_engine_yaml_kv_tiers_map_onto_the_config():
    """The operator's engine.yaml would silently size no tiers."""
    config = engine_config_from_dict(
        {
            "kv_tiers": {
                "host_gib": 2.5,
                "disk": {
                    "enabled": True,
                    "dir": "/d",
                    "gib": 8,
                    "prefetch_num_reqs": 3,
                    "write_behind": True,
                },
            }
        }
    )
    assert (config.host_kv_gib, config.disk_tier_dir, config.disk_kv_gib) == (2.5, "/d", 8)
    assert (config.disk_tier_enabled, config.disk_prefetch_num_reqs) == (True, 3)
    assert config.disk_write_behind and not EngineConfig().disk_write_behind


def test_disabled_disk_tier_keeps_no_folder():
    """A disabled disk tier would still write into an unmounted folder of the pod."""
    config = engine_config_from_dict({"kv_tiers": {"disk": {"enabled": False, "dir": "/d"}}})
    assert (config.disk_tier_dir, config.disk_tier_enabled) == ("", False)


def test_flags_override_the_tier_sizes():
    """`--host-kv-gib` and `--disk-prefetch-num-reqs` would be ignored."""
    from argparse import Namespace

    args = Namespace(
        config=None, role=None, model=None, model_path=None, max_batch_size=None,
        max_num_batched_tokens=None, kv_pages=None, device=None, disk_tier_dir="/x",
        host_kv_gib=1.5, disk_kv_gib=None, disk_prefetch_num_reqs=0,
    )  # fmt: skip
    config = engine_config_from_args(args)
    assert (config.host_kv_gib, config.disk_kv_gib, config.disk_prefetch_num_reqs) == (1.5, 32, 0)


def test_negative_tier_size_names_the_field():
    """A negative size would allocate nothing and fail far from the bad value."""
    with pytest.raises(ValueError, match="host_kv_gib must be >= 0, got -1"):
        EngineConfig(host_kv_gib=-1)


def test_disk_folder_is_per_model_identity():
    """Ranks of other weights with the same page shape would read each other's KV as theirs."""
    config = EngineConfig(disk_tier_dir="/d")
    model = resolve_model_config(config)
    roots = {
        disk_tier_root(model, config),
        disk_tier_root(model, config.with_changes(seed=1)),
        disk_tier_root(model, config.with_changes(model_path="/models/a")),
        # an fp8 fleet's blocks in a folder of their own: a bf16 fleet beside it on the volume
        # would otherwise find them as foreign blocks and remove them (and the other way round)
        disk_tier_root(model, config.with_changes(kv_cache_dtype="fp8_e4m3")),
    }
    assert len(roots) == 4
    assert all(root.startswith("/d/model-") for root in roots)


def test_tier_config_gives_the_disk_tier_its_gib_and_folder(tmp_path):
    """A disk folder without pages (or pages without a folder) would be a tier that never holds."""
    config = EngineConfig(kv_pages=40, disk_tier_dir=str(tmp_path), disk_kv_gib=1.0)
    model = resolve_model_config(config)
    kv = build_kv(model, config, torch.float32)
    tiers = tier_config(model, config, kv.store_config, kv.layout)
    assert tiers.disk_dir == disk_tier_root(model, config)
    step = typical_step(model, config)
    split = tier_pages(GIB, step, kv.store_config.life_cycles, kv.layout)
    assert dict(tiers.disk_pages) == split and all(split.values())
    assert dict(tiers.host_pages) == {"full": 0, "window": 0}
    assert not tiers.disk_write_behind
    behind = dataclasses.replace(config, disk_write_behind=True)
    assert tier_config(model, behind, kv.store_config, kv.layout).disk_write_behind


def test_model_reads_the_tiers_device_kv():
    """The model would write pages the tiers never offload (or read pages they never onboard)."""
    from kvfleet.services.engine.kv.device_kv_cache import DeviceKVCache

    config = EngineConfig(kv_pages=8, host_kv_pages=4)
    model = resolve_model_config(config)
    tiers = open_kv_tiers(model, config, build_kv(model, config, torch.float32), "cpu")
    try:
        cache = DeviceKVCache(model, tiers.device_kv)
        k, _ = cache.kv(1)
        k[3].fill_(1.5)
        assert cache.group_of(1) == "window"
        assert torch.equal(tiers.device_kv.storage("window")[0, 0, 3], k[3])
        assert cache.num_pages == {"full": 8, "window": 8}
        cache.check_integrity()
    finally:
        tiers.close()
