"""Tier invariants under random workloads, with the byte-less tiers the simulator drives."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.events import KVEvent, KVEventKind
from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import AllReusable, PerConversation
from kvfleet.kvstore.tiers.build import TierConfig, build_tiers

BLOCK = 4
LIFE_CYCLES = (FullLifeCycle("full"), WindowLifeCycle("swa", window_tokens=2 * BLOCK))


def _sim_manager(policy, host_pages, disk_pages, events):
    store = KVStoreConfig(
        block_size=BLOCK,
        life_cycles=LIFE_CYCLES,
        pool_pages={"full": 12, "swa": 8},
        reuse_policy=policy,
        checkpoint=False,
    )
    names = [lc.name for lc in LIFE_CYCLES]
    tiers = build_tiers(
        store,
        TierConfig(dict.fromkeys(names, host_pages), dict.fromkeys(names, disk_pages)),
    )
    return KVCacheManager(store, events.append, tiers)


def _announced(events):
    """Blocks the event stream says this rank holds."""
    held = set()
    for event in events:
        key = (event.life_cycle, event.block_hash)
        (held.add if event.kind == KVEventKind.STORED else held.discard)(key)
    return held


def _rank_blocks(manager):
    """Blocks on this rank's device pools or host tier."""
    held = set()
    for name, pool in manager.pools.items():
        held.update((name, pool.page_hash(p)) for p in range(1, pool.num_pages))
        held.update((name, h) for h in manager.tiers.host.hashes(name))
    return {key for key in held if key[1] is not None}


turns = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 5), st.integers(0, 4)), min_size=1, max_size=14
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=turns,
    host_pages=st.integers(0, 6),
    disk_pages=st.integers(0, 10),
    per_conversation=st.booleans(),
)
def test_indexes_and_events_stay_consistent(turns, host_pages, disk_pages, per_conversation):
    """Any workload must keep pools and tier indexes whole and events equal to rank contents."""
    events: list[KVEvent] = []
    policy = PerConversation(max_num_turns=1) if per_conversation else AllReusable()
    manager = _sim_manager(policy, host_pages, disk_pages, events)
    for number, (conversation, base_blocks, extra) in enumerate(turns):
        prompt = [conversation * 1000 + i for i in range(base_blocks * BLOCK + extra)]
        request_id = f"r{number}"
        manager.add_request(request_id, prompt, conversation_id=f"c{conversation}")
        remaining = len(prompt) - manager.match(request_id).num_reusable_tokens
        if not manager.can_admit(request_id, remaining):
            manager.finish_request(request_id)
            continue
        allocation = manager.admit(request_id, remaining)
        manager.allocate(request_id, len(prompt) - allocation.num_reused_tokens)
        manager.commit(request_id, len(prompt))
        manager.finish_context(request_id)
        manager.finish_request(request_id)
        manager.check_integrity()
        assert _announced(events) == _rank_blocks(manager)
        for name in manager.pools:
            assert manager.tiers.host.num_blocks(name) <= host_pages
            assert manager.tiers.disk.index.num_blocks(name) <= disk_pages


def test_a_block_spilled_to_host_is_not_announced_as_removed():
    """Device eviction onto host must not tell the router the rank lost the block."""
    events: list[KVEvent] = []
    manager = _sim_manager(AllReusable(), host_pages=16, disk_pages=0, events=events)
    for conversation in range(4):
        prompt = [conversation * 1000 + i for i in range(4 * BLOCK)]
        manager.add_request(f"r{conversation}", prompt)
        manager.admit(f"r{conversation}", len(prompt))
        manager.commit(f"r{conversation}", len(prompt))
        manager.finish_context(f"r{conversation}")
        manager.finish_request(f"r{conversation}")
    assert [e for e in events if e.kind == KVEventKind.REMOVED and e.life_cycle == "full"] == []
    assert manager.tiers.metrics["host"].pages_in > 0
    manager.check_integrity()


def test_sim_tiers_report_where_blocks_are_without_bytes():
    """The simulator's byte-less tiers must still place blocks on host and disk and onboard."""
    events: list[KVEvent] = []
    manager = _sim_manager(AllReusable(), host_pages=2, disk_pages=32, events=events)
    prompts = [[c * 1000 + i for i in range(4 * BLOCK)] for c in range(6)]
    for number, prompt in enumerate(prompts):
        manager.add_request(f"r{number}", prompt)
        manager.admit(f"r{number}", len(prompt))
        manager.commit(f"r{number}", len(prompt))
        manager.finish_context(f"r{number}")
        manager.finish_request(f"r{number}")
    manager.add_request("again", prompts[0] + [1])
    assert manager.match("again").locations["full"] == ("disk",) * 4
    allocation = manager.admit("again", 1)
    assert allocation.num_reused_tokens == 4 * BLOCK
    assert manager.tiers.metrics["disk"].hits == 4 + 2  # full and the window's endpoint
    manager.finish_request("again")
    manager.check_integrity()
