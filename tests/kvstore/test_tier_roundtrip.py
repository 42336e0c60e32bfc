"""Offload then onboard returns bit-identical KV through every tier, for every life cycle."""

import pytest
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.life_cycles import (
    FullLifeCycle,
    PrivateLifeCycle,
    StateLifeCycle,
    WindowLifeCycle,
)
from tier_factories import BLOCK, make_tiered, prompt_of, serve

LIFE_CYCLES = (
    FullLifeCycle("full"),
    WindowLifeCycle("swa", window_tokens=2 * BLOCK),
    StateLifeCycle("ssm", every_tokens=BLOCK),
)


def _evict_a_with(manager, count):
    """Serve turn "a", then `count` unrelated turns that push it off the device."""
    serve(manager, "a", prompt_of(1))
    for seed in range(2, 2 + count):
        serve(manager, f"push{seed}", prompt_of(seed))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3fn"])
# host_pages 0: a rank given a disk tier and no host tier (its evictions go straight to disk)
@pytest.mark.parametrize(("host_pages", "tier"), [(16, "host"), (2, "disk"), (0, "disk")])
def test_offloaded_blocks_come_back_bit_identical(host_pages, tier, dtype):
    """A turn resumed from host or disk must see exactly the KV its earlier turn computed."""
    manager = make_tiered(LIFE_CYCLES, device_pages=6, host_pages=host_pages, dtype=dtype)
    _evict_a_with(manager, 3)
    prompt = prompt_of(1) + prompt_of(9, BLOCK)
    manager.add_request("a2", prompt)
    match = manager.match("a2")
    assert match.num_reusable_blocks == 4
    assert match.locations == {
        "full": (tier,) * 4,
        "swa": ("", "", tier, tier),
        "ssm": ("", "", "", tier),
    }
    manager.finish_request("a2")
    assert serve(manager, "a2b", prompt) == 4 * BLOCK  # serve() checks every reused page's bytes
    assert manager.tiers.metrics[tier].hits == 4 + 2 + 1
    manager.check_integrity()
    manager.tiers.close()


def test_onboarded_blocks_are_device_hits_next_time():
    """After onboarding, a resend must find the blocks on the device, not copy them again."""
    manager = make_tiered(LIFE_CYCLES, device_pages=8, host_pages=16)
    _evict_a_with(manager, 3)
    prompt = prompt_of(1) + prompt_of(9, BLOCK)
    serve(manager, "a2", prompt)
    manager.add_request("a3", prompt)
    assert set(manager.match("a3").locations["full"]) == {"device"}
    manager.finish_request("a3")
    manager.check_integrity()
    manager.tiers.close()


def test_private_pages_never_leave_the_device():
    """Per-request scratch must not be offloaded: nobody can ever find it."""
    life_cycles = (FullLifeCycle("full"), PrivateLifeCycle("scratch"))
    manager = make_tiered(life_cycles, device_pages=6, host_pages=16)
    _evict_a_with(manager, 3)
    assert manager.tiers.host.num_blocks("scratch") == 0
    assert manager.tiers.host.num_blocks("full") == 16 - 5  # all but the 5 device pages
    manager.check_integrity()
    manager.tiers.close()


def test_device_eviction_order_decides_what_reaches_host():
    """A finished prompt's pages join the LRU tail first: its tail is offloaded first and its
    head, the part later prompts share, stays on the device longest."""
    manager = make_tiered(device_pages=5, host_pages=16)
    serve(manager, "a", prompt_of(1))
    serve(manager, "b", prompt_of(2, 2 * BLOCK))
    manager.add_request("a2", [*prompt_of(1), 7])
    assert manager.match("a2").locations["full"] == ("device", "device", "host", "host")
    manager.finish_request("a2")
    manager.check_integrity()
    manager.tiers.close()


@pytest.mark.parametrize("exclusive", [True, False])
def test_an_exclusive_host_holds_no_block_the_device_holds(exclusive):
    """Onboarded from host, a block leaves host (exclusive, the default) and goes back down
    when the device evicts it again: the two tiers hold the sum of their distinct blocks.
    Inclusive, host keeps a copy of every block it gave back, and the integrity check passes
    only because it asks nothing of an inclusive host."""
    manager = make_tiered(device_pages=6, host_pages=16, disk_pages=0, host_exclusive=exclusive)
    _evict_a_with(manager, 3)
    first = block_hashes(prompt_of(1), BLOCK)
    host = manager.tiers.host
    assert all(host.lookup("full", h) is not None for h in first)
    prompt = prompt_of(1) + prompt_of(9, BLOCK)
    assert serve(manager, "a2", prompt) == 4 * BLOCK
    on_host = [host.lookup("full", h) is not None for h in first]
    assert on_host == [not exclusive] * 4
    manager.check_integrity()
    # pushed off the device again, the blocks are back on host, bytes intact
    for seed in range(20, 23):
        serve(manager, f"again{seed}", prompt_of(seed))
    assert all(host.lookup("full", h) is not None for h in first)
    assert serve(manager, "a3", prompt) == 4 * BLOCK  # serve() checks every reused page's bytes
    manager.check_integrity()
    manager.tiers.close()
