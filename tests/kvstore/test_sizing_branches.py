"""Pool sizing with branch points and under pressure: live pages at a driven peak fit the plan,
and a pressed split still leaves room for one long conversation."""

import pytest
from kv_factories import make_manager, tokens
from kvfleet.kvstore.life_cycles import (
    FullLifeCycle,
    PrivateLifeCycle,
    StateLifeCycle,
    WindowLifeCycle,
)
from kvfleet.kvstore.policies import PerConversation
from kvfleet.kvstore.sizing import TypicalStep, plan_pools

BLOCK, CHUNK, DECODE, TURNS, KEEP = 8, 32, 8, 3, 2
LIFE_CYCLES = [
    FullLifeCycle("full"),
    WindowLifeCycle("swa", 32, replay_tokens=16),
    StateLifeCycle("ssm", every_tokens=64),
    PrivateLifeCycle("scratch"),
]


def drive_to_peak(manager, num_slots, num_conversations, reset_turns=(), kept_tokens=32):
    """Run every conversation's turns (chunked prefill, decode) with `num_slots` resident;
    return the most live pages seen per pool. A turn in `reset_turns` (0-based) keeps only the
    first `kept_tokens` of the conversation's prompt before its own tokens."""
    queues = {
        f"c{c}": [tokens(c * 10 + t, 64 if t == 0 else 40) for t in range(TURNS)]
        for c in range(num_conversations)
    }
    prompts = {c: [] for c in queues}
    active: dict[str, dict] = {}
    peak = dict.fromkeys(manager.pools, 0)

    def record():
        for name, pool in manager.pools.items():
            peak[name] = max(peak[name], pool.num_in_use)

    for _ in range(10_000):
        for conversation, turns in queues.items():
            busy = any(r["conversation"] == conversation for r in active.values())
            if turns and not busy and len(active) < num_slots:
                kept = kept_tokens if TURNS - len(turns) in reset_turns else None
                prompts[conversation] = prompts[conversation][:kept] + turns.pop(0)
                request_id = f"{conversation}t{TURNS - len(turns)}"
                manager.add_request(request_id, prompts[conversation], conversation)
                prompt_len = len(prompts[conversation])
                active[request_id] = {"conversation": conversation, "len": prompt_len, "out": 0}
        if not active:
            return peak
        for request_id, request in list(active.items()):
            progress = manager.progress(request_id) if request.get("admitted") else None
            if progress is None:
                reused = manager.match(request_id).num_reusable_tokens
                size = min(CHUNK, request["len"] - reused)
                assert manager.can_admit(request_id, size)
                manager.admit(request_id, size)
                request["admitted"], done = True, reused + size
            elif progress.num_computed_tokens < request["len"]:
                size = min(CHUNK, request["len"] - progress.num_computed_tokens)
                assert manager.can_allocate(request_id, size)
                manager.allocate(request_id, size)
                done = progress.num_computed_tokens + size
            else:
                assert manager.can_allocate(request_id, 1)
                manager.allocate(request_id, 1)
                manager.append_tokens(request_id, [7])
                done, request["out"] = progress.num_computed_tokens + 1, request["out"] + 1
            record()
            manager.commit(request_id, done)
            if done == request["len"]:
                manager.finish_context(request_id)
            if request["out"] == DECODE:
                manager.finish_request(request_id)
                del active[request_id]
        manager.check_integrity()
    raise AssertionError("workload did not finish in 10,000 steps")


def test_live_pages_at_peak_fit_a_plan_that_counts_branch_points():
    """Resets keep a branch window while they run and a branch record after: sizing must hold
    both (one more retained turn per conversation, one more kept window per resident request)."""
    num_conversations, policy = 3, PerConversation(1, keep_branch_points=1)
    max_context = 64 + 40 * (TURNS - 1) + DECODE
    step = TypicalStep(
        3,
        max_context,
        CHUNK,
        num_conversations * policy.retained_turns,
        branch_points=True,
        branch_records=num_conversations,
    )
    plan = plan_pools(step, LIFE_CYCLES, BLOCK)
    manager = make_manager(
        LIFE_CYCLES, dict(plan.pool_pages), BLOCK, policy, checkpoint_margin_tokens=8
    )
    peak = drive_to_peak(manager, 3, num_conversations, reset_turns=(2,))
    for name, need in plan.demand.items():
        assert 0 < peak[name] <= need, (name, peak[name], need)
    held = [t.branch_tokens for c in range(3) for t in manager.retained_turns(f"c{c}")]
    assert held.count(32) == num_conversations  # every reset kept its branch at 32
    # resident: min(19, ceil((32 + 32) / 8) + 1 + (ckpt + branch) x 4) = 17;
    # retained: 3 turns x (endpoint + checkpoint) x 4 + 3 branch records x 4
    assert plan.demand["swa"] == 3 * 17 + 3 * 8 + 3 * 4
    assert plan.demand["ssm"] == 3 * (3 + 1 + 1 + 1) + 3 * 2 + 3 * 1  # 1 periodic a chunk
    manager.check_integrity()


def test_branch_records_count_one_window_not_a_turns_two():
    """Counting a branch record as a whole turn would take full-pool pages it never uses."""
    as_turns = TypicalStep(1, 4096, 512, retained_turns=6, branch_points=True)
    as_records = TypicalStep(1, 4096, 512, retained_turns=6, branch_points=True, branch_records=2)
    turns, records = (plan_pools(step, LIFE_CYCLES, 64).demand for step in (as_turns, as_records))
    # swa: 2 records x (endpoint + checkpoint) -> 2 x one window of ceil(32 / 64) = 1 block
    assert (turns["swa"] - records["swa"], turns["ssm"] - records["ssm"]) == (2, 2)
    # full: a record's blocks are a prefix of its conversation's, which the turns count
    assert turns["full"] - records["full"] == 2 * 4096 // 64
    with pytest.raises(ValueError, match="branch_records <= retained_turns, got 7 and 6"):
        TypicalStep(1, 4096, 512, retained_turns=6, branch_records=7)


@pytest.mark.parametrize("total", [1000, 2500, 3000, 3500, 5000, 20000])
def test_pressed_split_leaves_the_full_pool_room_for_a_rewritten_prompt(total):
    """If this fails, a proportional split under pressure gives the window pool pages for
    retained turns of many conversations while the full pool cannot hold one prompt at the
    longest context next to the previous turn's prefix, so one conversation alone on the rank
    loses its prefix at the first rewritten turn."""
    life_cycles = [FullLifeCycle("full"), WindowLifeCycle("swa", 4096, replay_tokens=512)]
    context = 131072
    step = TypicalStep(
        2, context, 8192, retained_turns=15, full_tokens_per_retained_turn=context // 5
    )
    pages = plan_pools(step, life_cycles, 64, total_pages=total).pool_pages
    # one request alone: sliding (4096 + 8192) / 64 + 1 + checkpoint 64, its turn's two windows
    window_floor = 193 + 64 + 128 + 1
    assert sum(pages.values()) == total
    if total < window_floor + context // 64 + 1:  # not even one request alone fits: no floor
        # but one resident's window pages (sliding 193 + checkpoint 64, null page) still go
        # first, so a shorter prompt runs; no retained turn is weighed (residents fill it)
        assert pages["swa"] == max(258, total * (2 * 257) // (2 * 257 + 2 * 2048))
        return
    assert pages["swa"] >= window_floor
    assert pages["full"] >= min(2 * context // 64 + 1, total - window_floor)
    if total >= 20000:  # the typical step fits: the proportional split is kept
        assert pages["swa"] == total * 2434 // 12680
