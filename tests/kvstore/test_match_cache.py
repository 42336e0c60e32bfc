"""A match handed out again (the manager keeps the last one while the indexes it read are
unchanged) must equal a fresh walk of the pools and tiers, under any order of calls."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_factories import tokens
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.matching import match_prompt
from kvfleet.kvstore.policies import AllReusable, PerConversation
from kvfleet.kvstore.tiers.build import TierConfig, build_tiers
from kvfleet.kvstore.tiers.disk_files import SharedBlockSet
from kvfleet.kvstore.tiers.stack import SHARED_FOLDER_TRUST_SECONDS, KVTiers
from test_properties import step

BLOCK = 4
LIFE_CYCLES = (FullLifeCycle("full"), WindowLifeCycle("swa", window_tokens=2 * BLOCK))
BASES = [tokens(seed, 40) for seed in range(3)]


def store_config(per_conversation: bool) -> KVStoreConfig:
    """Both life cycles' pools, small; one retained turn per conversation or all reusable."""
    return KVStoreConfig(
        block_size=BLOCK,
        life_cycles=LIFE_CYCLES,
        pool_pages={"full": 14, "swa": 10},
        reuse_policy=PerConversation(max_num_turns=1) if per_conversation else AllReusable(),
        checkpoint=False,
    )


def tiered_manager(per_conversation: bool, host_pages: int, disk_pages: int) -> KVCacheManager:
    store = store_config(per_conversation)
    names = [lc.name for lc in LIFE_CYCLES]
    tiers = build_tiers(
        store, TierConfig(dict.fromkeys(names, host_pages), dict.fromkeys(names, disk_pages))
    )
    return KVCacheManager(store, lambda event: None, tiers)


def fresh_match(manager: KVCacheManager, request_id: str):
    """The match walked now, ignoring any kept one."""
    state = manager._requests[request_id]
    locate = manager.tiers.locate if manager.tiers.has_lower_tiers else None
    hashes = state.sequence.hashes
    return match_prompt(hashes, state.prompt_len, manager.config, manager.pools, locate)


operation = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.integers(0, 2), st.integers(1, 40)),
    st.tuples(st.just("turn"), st.integers(0, 2), st.integers(0, 2), st.integers(1, 40)),
    st.tuples(st.just("step"), st.integers(0, 50)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.sampled_from(["drop", "release"]), st.integers(0, 2)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_conversation=st.booleans(),
    host_pages=st.integers(0, 6),
    disk_pages=st.integers(0, 10),
    operations=st.lists(operation, min_size=20, max_size=40),
)
def test_a_kept_match_equals_a_fresh_one(per_conversation, host_pages, disk_pages, operations):
    """Requests waiting while others are admitted, computed, evicted to host and disk, onboarded
    back, finished and their conversations dropped or released: every match the manager hands
    out equals a fresh walk (asked twice, as an admission does)."""
    manager = tiered_manager(per_conversation, host_pages, disk_pages)
    prompts: dict[str, int] = {}
    for number, op in enumerate(operations):
        live = sorted(prompts)
        if op[0] == "add":
            _, conversation, base, length = op
            prompt = BASES[base][:length] + tokens(1000 + number, 3)
            manager.add_request(f"r{number}", prompt, f"c{conversation}")
            prompts[f"r{number}"] = len(prompt)
        elif op[0] == "turn":  # a whole turn: its prompt computed, retained, finished
            _, conversation, base, length = op
            prompt = BASES[base][:length] + tokens(2000 + number, 3)
            manager.add_request(f"t{number}", prompt, f"c{conversation}")
            for _ in range(4 * len(prompt)):
                if manager.progress(f"t{number}").context_done:
                    break
                step(manager, f"t{number}", len(prompt))
            manager.finish_request(f"t{number}")
        elif op[0] == "step" and live:
            request_id = live[op[1] % len(live)]
            step(manager, request_id, prompts[request_id])
        elif op[0] == "finish" and live:
            request_id = live[op[1] % len(live)]
            manager.finish_request(request_id)
            del prompts[request_id]
        elif op[0] == "drop":
            manager.drop_conversation(f"c{op[1]}")
        elif op[0] == "release" and manager.can_release_conversation(f"c{op[1]}"):
            manager.release_conversation(f"c{op[1]}")
        for request_id in prompts:
            assert manager.match(request_id) == fresh_match(manager, request_id), request_id
            assert manager.match(request_id) == fresh_match(manager, request_id), request_id
        manager.check_integrity()


def test_a_match_is_walked_once_while_nothing_changes():
    """An admission's several asks walk the pools once; a commit elsewhere walks again."""
    manager = tiered_manager(False, host_pages=4, disk_pages=0)
    manager.add_request("a", BASES[0][:16])
    manager.admit("a", 16)
    manager.commit("a", 16)
    manager.add_request("b", [*BASES[0][:16], 1, 2, 3])
    first = manager.match("b")
    assert manager.match("b") is first
    manager.finish_context("a")  # nothing the match reads changed
    assert manager.match("b") is first
    manager.add_request("c", BASES[1][:8])
    manager.admit("c", 8)
    manager.commit("c", 8)  # new blocks indexed: walked again
    assert manager.match("b") is not first
    assert manager.match("b") == first


def test_a_dropped_conversation_leaves_no_kept_match_behind():
    """Blocks that leave the device (a dropped conversation's pages freed) must not stay in
    a waiting request's match."""
    manager = tiered_manager(True, host_pages=0, disk_pages=0)
    manager.add_request("t1", BASES[0][:16], "c0")
    manager.admit("t1", 16)
    manager.commit("t1", 16)
    manager.finish_context("t1")
    manager.finish_request("t1")
    manager.add_request("t2", [*BASES[0][:16], 1, 2, 3], "c0")
    assert manager.match("t2").num_reusable_tokens == 16
    manager.drop_conversation("c0")
    assert manager.match("t2") == fresh_match(manager, "t2")
    assert manager.match("t2").num_reusable_tokens == 0


def shared_volume_manager(volume: SharedBlockSet, disk_pages: int) -> KVCacheManager:
    """A rank's manager (device pages only, no host tier) whose disk tier is on `volume`."""
    store = KVStoreConfig(
        block_size=BLOCK,
        life_cycles=(FullLifeCycle("full"),),
        pool_pages={"full": 14},
        reuse_policy=AllReusable(),
        checkpoint=False,
    )
    tiers = KVTiers({"full": 0}, {"full": disk_pages}, {"full": 0}, disk_files=volume)
    return KVCacheManager(store, lambda event: None, tiers)


def test_a_block_another_rank_evicts_from_the_shared_volume_leaves_the_kept_match():
    """If this fails, a request whose match found another rank's blocks on the simulator's
    shared volume, which that rank's index then evicted, is admitted against the kept match:
    every read misses, and the admission stages the same gone blocks again, for ever (a
    simulator replay ran for hours on one admission)."""
    volume = SharedBlockSet()
    writer, reader, third = (shared_volume_manager(volume, 4) for _ in range(3))
    for block_hash in range(4):
        third.tiers.disk.store("full", block_hash, lambda: None)
    prompt = [*BASES[0][:16], 1, 2, 3]
    reader.add_request("r", prompt)
    assert reader.match("r").num_reusable_tokens == 0
    for block_hash in reader._requests["r"].sequence.hashes[:4]:
        writer.tiers.disk.store("full", block_hash, lambda: None)
    assert reader.match("r").num_reusable_tokens == 16  # the writer's blocks, on the volume
    for block_hash in range(4):  # the writer adopts the third rank's blocks: its own four
        assert writer.tiers.disk.read("full", block_hash, None)  # leave, files and all
    assert reader.match("r") == fresh_match(reader, "r")
    reader.admit("r", len(prompt))
    assert reader.progress("r").num_computed_tokens == 0
    reader.check_integrity()


def shared_volume_pair(per_conversation: bool, host_pages: int, disk_pages: int):
    """Two ranks' managers (both life cycles, host and disk tiers) on one shared volume."""
    volume = SharedBlockSet()
    store = store_config(per_conversation)
    names = [lc.name for lc in LIFE_CYCLES]
    return [
        KVCacheManager(
            store,
            lambda event: None,
            KVTiers(
                dict.fromkeys(names, host_pages),
                dict.fromkeys(names, disk_pages),
                dict.fromkeys(names, 0),
                disk_files=volume,
            ),
        )
        for _ in range(2)
    ]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_conversation=st.booleans(),
    host_pages=st.integers(0, 4),
    disk_pages=st.integers(1, 6),
    operations=st.lists(st.tuples(st.integers(0, 1), operation), min_size=20, max_size=40),
)
def test_a_kept_match_equals_a_fresh_one_on_a_shared_volume(
    per_conversation, host_pages, disk_pages, operations
):
    """The same as above with two ranks writing, reading and evicting one shared volume, each
    operation on either: a rank's kept match must follow the other rank's changes too (a block
    the other wrote is found, one it evicted is gone), and every admission ends."""
    ranks = shared_volume_pair(per_conversation, host_pages, disk_pages)
    prompts: list[dict[str, int]] = [{}, {}]
    for number, (rank, op) in enumerate(operations):
        manager, live = ranks[rank], sorted(prompts[rank])
        if op[0] in ("add", "turn"):
            _, conversation, base, length = op
            request_id = f"{op[0][0]}{number}"
            prompt = BASES[base][:length] + tokens(1000 + number, 3)
            manager.add_request(request_id, prompt, f"c{conversation}")
            if op[0] == "add":
                prompts[rank][request_id] = len(prompt)
            else:  # a whole turn: its prompt computed, retained, finished
                for _ in range(4 * len(prompt)):
                    if manager.progress(request_id).context_done:
                        break
                    step(manager, request_id, len(prompt))
                manager.finish_request(request_id)
        elif op[0] == "step" and live:
            request_id = live[op[1] % len(live)]
            step(manager, request_id, prompts[rank][request_id])
        elif op[0] == "finish" and live:
            request_id = live[op[1] % len(live)]
            manager.finish_request(request_id)
            del prompts[rank][request_id]
        elif op[0] == "drop":
            manager.drop_conversation(f"c{op[1]}")
        elif op[0] == "release" and manager.can_release_conversation(f"c{op[1]}"):
            manager.release_conversation(f"c{op[1]}")
        for other, requests in zip(ranks, prompts, strict=True):
            for request_id in requests:
                assert other.match(request_id) == fresh_match(other, request_id), request_id
            other.check_integrity()


def test_a_match_that_read_a_shared_folder_is_walked_again_only_after_its_window(tmp_path):
    """If this fails either way: a waiting request on a rank with a shared disk folder walked
    its whole prefix at every ask, several times a step (the pauses between a 1b rank's
    decode steps), or never saw the blocks another rank wrote to the folder while it waited."""
    store = store_config(True)
    names = [lc.name for lc in LIFE_CYCLES]
    now = [100.0]
    writer, reader = (
        KVCacheManager(
            store,
            lambda event: None,
            build_tiers(
                store,
                TierConfig(dict.fromkeys(names, 0), dict.fromkeys(names, 8), str(tmp_path)),
            ),
            clock=lambda: now[0],
        )
        for _ in range(2)
    )
    prompt = [*BASES[0][:16], 1, 2, 3]
    reader.add_request("r", prompt)
    first = reader.match("r")
    assert first.num_reusable_tokens == 0
    writer.add_request("w", BASES[0][:16], "c0")
    writer.admit("w", 16)
    writer.commit("w", 16)
    writer.finish_context("w")
    writer.finish_request("w")
    assert writer.flush_retained_to_disk() > 0  # the writer's blocks, in the shared folder
    assert reader.match("r") is first  # asked again within the window: not walked
    now[0] += SHARED_FOLDER_TRUST_SECONDS * 1.01  # a window at most
    assert reader.match("r") == fresh_match(reader, "r")
    assert reader.match("r").num_reusable_tokens == 16
