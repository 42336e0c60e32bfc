"""Pool sizing proofs: drive a real manager to its peak and count live pages per pool.

Each scenario is tight: the live pages at the peak fit the plan, and exceed the plan that forgets
one retained turn, the checkpoint, or the from-end snapshots (so a sizing rule that forgets any
of them fails here). Prompts are long enough to plan a checkpoint on every later turn; each
conversation runs one turn more than `per_conversation(max_num_turns)` retains.
"""

from dataclasses import replace

import pytest
from kv_factories import make_manager, tokens
from kvfleet.kvstore.block_pool import NULL_PAGE
from kvfleet.kvstore.life_cycles import (
    FullLifeCycle,
    PrivateLifeCycle,
    StateLifeCycle,
    WindowLifeCycle,
)
from kvfleet.kvstore.policies import PerConversation
from kvfleet.kvstore.sizing import TypicalStep, plan_pools

BLOCK, CHUNK, DECODE, KEEP, MARGIN = 8, 32, 8, 2, 8
TURNS = KEEP + 1
FIRST, APPEND = 64, 40
# The checkpoint falls at prompt_len - 8 (replay) - 8 (margin); the extra from-end offset 24
# puts a snapshot one block before it, so neither hides the other.
SSM = StateLifeCycle("ssm", every_tokens=32, offsets_from_end=(0, 24))
LIFE_CYCLES = [
    FullLifeCycle("full"),
    WindowLifeCycle("swa", 16, replay_tokens=8),
    SSM,
    PrivateLifeCycle("scratch"),
]
MAX_CONTEXT = FIRST + APPEND * (TURNS - 1) + DECODE


def drive_to_peak(manager, num_slots: int, conversations: int) -> dict[str, int]:
    """Run every conversation's turns (each appends to the last prompt; chunked prefill, then
    decode) with up to `num_slots` resident in lock step; the most live pages seen per pool."""
    queues = {
        f"c{c}": [tokens(c * 10 + t, FIRST if t == 0 else APPEND) for t in range(TURNS)]
        for c in range(conversations)
    }
    prompts: dict[str, list[int]] = {c: [] for c in queues}
    active: dict[str, dict] = {}
    peak = dict.fromkeys(manager.pools, 0)
    for _ in range(10_000):
        for conversation, turns in queues.items():
            busy = any(r["conversation"] == conversation for r in active.values())
            if turns and not busy and len(active) < num_slots:
                prompts[conversation] = prompts[conversation] + turns.pop(0)
                request_id = f"{conversation}t{TURNS - len(turns)}"
                manager.add_request(request_id, prompts[conversation], conversation)
                length = len(prompts[conversation])
                active[request_id] = {"conversation": conversation, "len": length, "out": 0}
        if not active:
            return peak
        for request_id, request in active.items():  # every resident allocates, then all commit
            if not request.get("admitted"):
                reused = manager.match(request_id).num_reusable_tokens
                size = min(CHUNK, request["len"] - reused)
                assert manager.can_admit(request_id, size)
                manager.admit(request_id, size)
                request["admitted"], request["done"] = True, reused + size
            elif request["done"] < request["len"]:
                size = min(CHUNK, request["len"] - request["done"])
                assert manager.can_allocate(request_id, size)
                manager.allocate(request_id, size)
                request["done"] += size
            else:
                assert manager.can_allocate(request_id, 1)
                manager.allocate(request_id, 1)
                manager.append_tokens(request_id, [7])
                request["done"], request["out"] = request["done"] + 1, request["out"] + 1
        for name, pool in manager.pools.items():
            peak[name] = max(peak[name], pool.num_in_use)
        for request_id, request in list(active.items()):
            manager.commit(request_id, request["done"])
            if request["done"] == request["len"]:
                manager.finish_context(request_id)
            if request["out"] == DECODE:
                manager.finish_request(request_id)
                del active[request_id]
        manager.check_integrity()
    raise AssertionError("workload did not finish in 10,000 steps")


def step_for(num_slots: int, retained_turns: int, checkpoint: bool = True) -> TypicalStep:
    return TypicalStep(num_slots, MAX_CONTEXT, CHUNK, retained_turns, checkpoint=checkpoint)


def demand(step: TypicalStep, life_cycles=tuple(LIFE_CYCLES)) -> dict[str, int]:
    return dict(plan_pools(step, list(life_cycles), BLOCK).demand)


def run_at(num_slots: int, conversations: int, plan_step: TypicalStep) -> dict[str, int]:
    plan = plan_pools(plan_step, LIFE_CYCLES, BLOCK)
    manager = make_manager(
        LIFE_CYCLES,
        dict(plan.pool_pages),
        BLOCK,
        PerConversation(KEEP),
        checkpoint_margin_tokens=MARGIN,
    )
    peak = drive_to_peak(manager, num_slots, conversations)
    for conversation in range(conversations):
        assert len(manager.retained_turns(f"c{conversation}")) == KEEP
    manager.check_integrity()
    return peak


@pytest.mark.parametrize(("num_slots", "conversations"), [(1, 3), (3, 9)])
def test_peak_fits_the_plan_and_exceeds_each_wrong_plan(num_slots, conversations):
    """Wrong plans: one retained turn short per conversation (N-1), no checkpoint, no from-end
    snapshots. The peak comes at the last turns, every conversation holding KEEP turns."""
    retained = conversations * KEEP
    right = demand(step_for(num_slots, retained))
    peak = run_at(num_slots, conversations, step_for(num_slots, retained))
    for name, need in right.items():
        assert 0 < peak[name] <= need, (name, peak[name], need)
    one_turn_short = demand(step_for(num_slots, conversations * (KEEP - 1)))
    no_checkpoint = demand(step_for(num_slots, retained, checkpoint=False))
    no_from_end = demand(step_for(num_slots, retained), [replace(SSM, offsets_from_end=(0,))])
    for pool in ("swa", "ssm"):
        assert peak[pool] > one_turn_short[pool], (pool, peak[pool], one_turn_short[pool])
        assert peak[pool] > no_checkpoint[pool], (pool, peak[pool], no_checkpoint[pool])
    assert peak["ssm"] > no_from_end["ssm"], (peak["ssm"], no_from_end["ssm"])
    # the plan that counts a resident request's from-end snapshots but not the retained turns'
    unretained = demand(replace(step_for(num_slots, retained), retained_snapshots=False))
    assert peak["ssm"] > unretained["ssm"], (peak["ssm"], unretained["ssm"])


def test_retained_turns_keep_their_own_from_end_snapshots():
    """Each retained turn holds a snapshot at every from-end offset of its own prompt."""
    manager = make_manager(
        LIFE_CYCLES, 64, BLOCK, PerConversation(KEEP), checkpoint_margin_tokens=MARGIN
    )
    prompt: list[int] = []
    for turn in range(TURNS):
        prompt = prompt + tokens(turn, FIRST if turn == 0 else APPEND)
        manager.add_request(f"t{turn}", prompt, "c")
        manager.admit(f"t{turn}", len(prompt) - manager.match(f"t{turn}").num_reusable_tokens)
        manager.commit(f"t{turn}", len(prompt))
        manager.finish_context(f"t{turn}")
        manager.finish_request(f"t{turn}")
    prompt_lens = [FIRST + APPEND * turn for turn in range(1, TURNS)]
    records = manager.retained_turns("c")
    for record, prompt_len in zip(records, prompt_lens, strict=True):
        assert len(SSM.from_end_blocks(prompt_len, BLOCK)) == 2  # endpoint, 24 tokens before
        # endpoint, checkpoint and the from-end snapshot, each held
        assert len(set(record.pages["ssm"])) == 3, record.pages["ssm"]
        assert all(manager.pools["ssm"].ref_count(page) >= 1 for page in record.pages["ssm"])
    # a from-end boundary moves with the prompt: the turns share no snapshot
    assert not set(records[0].pages["ssm"]) & set(records[1].pages["ssm"])
    manager.check_integrity()


def test_split_is_proportional_to_demand():
    """A tier is split by what a typical step holds, every page given out."""
    step = TypicalStep(num_slots=2, max_context_tokens=256, chunk_tokens=32, retained_turns=4)
    plan = plan_pools(step, LIFE_CYCLES, BLOCK, total_pages=1000)
    assert sum(plan.pool_pages.values()) == 1000
    # ssm: 2 x (3 + 1 periodic + 1 ckpt + 1 from-end) + 4 x (1 + 1 + 1 from-end)
    assert plan.demand["ssm"] == 2 * 6 + 4 * 3
    assert plan.pool_pages["full"] > plan.pool_pages["scratch"] > plan.pool_pages["ssm"]


def test_a_from_end_snapshot_is_kept_under_pressure_until_its_turn_is_retained():
    """A request holds its from-end snapshot until its context ends: another request cannot
    evict it in between, so the retained turn always has it."""
    ssm = StateLifeCycle("ssm", offsets_from_end=(0, 24))
    manager = make_manager([ssm], 4, BLOCK, PerConversation(1))  # three usable pages
    prompt = tokens(1, 64)
    manager.add_request("a", prompt, "c")
    manager.admit("a", 8)
    for done in range(8, 64, 8):  # the from-end snapshot (block 4) is behind the state by now
        manager.commit("a", done)
        manager.allocate("a", 8)
    manager.add_request("b", tokens(2, 8))
    if manager.can_admit("b", 8):  # only if its page fits beside those "a" still holds
        manager.admit("b", 8)
        manager.commit("b", 8)
        manager.finish_context("b")
        manager.finish_request("b")
    manager.commit("a", 64)
    manager.finish_context("a")
    (record,) = manager.retained_turns("c")
    assert len(record.pages["ssm"]) == 2  # the endpoint and the snapshot 24 tokens before it
    manager.check_integrity()


def test_a_long_chunked_prefill_holds_state_pages_only_where_states_are_stored():
    """A 1000-token prompt in 256-token chunks (32 blocks each) holds at its peak only the page
    it resumes from, its running state and its snapshots: as many as the plan counts, where a
    page at every block a chunk passes would hold 33 or more."""
    ssm = StateLifeCycle("ssm", offsets_from_end=(0, 24))
    chunk, prompt_len = 256, 1000
    manager = make_manager([FullLifeCycle("full"), ssm], 200, BLOCK, PerConversation(1))
    manager.add_request("r", tokens(1, prompt_len), "c")
    manager.admit("r", chunk)
    before, done, peak = 0, chunk, manager.pools["ssm"].num_in_use
    stored = manager._state("r").commit_blocks["ssm"]
    while True:
        table = manager.page_table("r", "ssm")
        running = (done - 1) // BLOCK
        holders = {i for i, page in enumerate(table) if page != NULL_PAGE}
        assert holders <= stored | {running, (before - 1) // BLOCK}, holders
        manager.commit("r", done)
        if done == prompt_len:
            break
        size = min(chunk, prompt_len - done)
        manager.allocate("r", size)
        before, done = done, done + size
        peak = max(peak, manager.pools["ssm"].num_in_use)
    step = TypicalStep(num_slots=1, max_context_tokens=prompt_len, chunk_tokens=chunk)
    planned = plan_pools(step, [FullLifeCycle("full"), ssm], BLOCK).demand["ssm"]
    assert peak <= planned == 3 + 1 + 1  # resume, running, endpoint; checkpoint; from-end
    manager.finish_context("r")
    manager.finish_request("r")
    manager.check_integrity()
