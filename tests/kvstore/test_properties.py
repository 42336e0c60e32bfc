"""hypothesis: random sequences of manager calls keep every invariant."""

from hypothesis import given, settings
from hypothesis import strategies as st
from kv_factories import make_manager, tokens
from kvfleet.kvstore.block_pool import NULL_PAGE
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.life_cycles import (
    FullLifeCycle,
    PrivateLifeCycle,
    StateLifeCycle,
    WindowLifeCycle,
)
from kvfleet.kvstore.policies import REUSE_POLICIES, PerConversation

BLOCK, CHUNK = 4, 8
LIFE_CYCLES = [
    FullLifeCycle("full"),
    WindowLifeCycle("swa", 8, replay_tokens=4),
    StateLifeCycle("ssm", every_tokens=8),
    PrivateLifeCycle("scratch"),
    WindowLifeCycle("draft", 4, required=False),
]
BASES = [tokens(seed, 40) for seed in range(3)]
POLICIES = {
    **{name: factory() for name, factory in REUSE_POLICIES.items()},
    "per_conversation_root": PerConversation(max_num_turns=1, keep_root=True),
    "per_conversation_branch": PerConversation(max_num_turns=1, keep_branch_points=2),
}

operation = st.one_of(
    st.tuples(
        st.just("add"),
        st.integers(0, 2),
        st.integers(0, 2),
        st.integers(1, 40),
        st.integers(0, 16),
        st.lists(st.integers(1, 56), max_size=2),  # branch hints, clipped to the prompt
    ),
    st.tuples(st.just("step"), st.integers(0, 50)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("drop"), st.integers(0, 2)),
    st.tuples(st.just("release"), st.integers(0, 2)),
    st.tuples(st.just("release_branches"), st.integers(0, 2)),
)


def check_pages_hold_their_blocks(manager, prompts):
    """Every committed page in a request's table must carry that position's block id."""
    for request_id, prompt in prompts.items():
        hashes = block_hashes(prompt, BLOCK)
        for name, life_cycle in manager.life_cycles.items():
            if not life_cycle.reusable:
                continue
            table = manager.page_table(request_id, name)
            for index, page in enumerate(table[: len(hashes)]):
                committed = manager.pools[name].page_hash(page) if page != NULL_PAGE else None
                assert committed in (None, hashes[index]), (request_id, name, index)


def step(manager, request_id, prompt_len):
    """One scheduler step for a request: admit, a prefill chunk, or a decode token."""
    progress = manager.progress(request_id)
    if not progress.admitted:
        size = min(CHUNK, prompt_len - manager.match(request_id).num_reusable_tokens)
        if not manager.can_admit(request_id, size):
            return
        # the prefill starts where the admission's reuse ends, as the engine's scheduler starts
        # it: less than the match said where a disk block it counted was gone when read
        reused = manager.admit(request_id, size).num_reused_tokens
        manager.commit(request_id, reused + size)
    elif progress.num_computed_tokens < prompt_len:
        size = min(CHUNK, prompt_len - progress.num_computed_tokens)
        if not manager.can_allocate(request_id, size):
            return
        manager.allocate(request_id, size)
        manager.commit(request_id, progress.num_computed_tokens + size)
    else:
        if not manager.can_allocate(request_id, 1):
            return
        manager.allocate(request_id, 1)
        manager.append_tokens(request_id, [3])
        manager.commit(request_id, progress.num_computed_tokens + 1)
    progress = manager.progress(request_id)
    if progress.num_computed_tokens >= prompt_len and not progress.context_done:
        manager.finish_context(request_id)


def count_retained_pages(manager) -> int:
    """A fresh walk of every conversation's retained records (the cached count must agree)."""
    return len(
        {
            (name, page)
            for conversation in range(3)
            for record in manager.retained_turns(f"c{conversation}")
            for name, pages in record.pages.items()
            for page in pages
            if page is not None
        }
    )


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    pages=st.integers(10, 24),
    margin=st.sampled_from([4, 512]),
    operations=st.lists(operation, max_size=40),
)
def test_random_operations_keep_every_invariant(policy, pages, margin, operations):
    """Any call order the engine may use must leave pools consistent and pages truthful."""
    # NOTE: a 4-token margin puts checkpoints and branch points inside these short prompts.
    manager = make_manager(
        LIFE_CYCLES, pages, BLOCK, POLICIES[policy], checkpoint_margin_tokens=margin
    )
    prompts: dict[str, list[int]] = {}
    for number, op in enumerate(operations):
        live = sorted(prompts)
        if op[0] == "add":
            _, conversation, base, length, tail, hints = op
            prompt = BASES[base][:length] + tokens(1000 + number, tail)
            request_id = f"r{number}"
            hints = [hint for hint in hints if hint <= len(prompt)]
            manager.add_request(request_id, prompt, f"c{conversation}", branch_hints=hints)
            prompts[request_id] = prompt
            assert manager.match(request_id).num_reusable_tokens <= max(0, len(prompt) - 4)
        elif op[0] == "step" and live:
            request_id = live[op[1] % len(live)]
            step(manager, request_id, len(prompts[request_id]))
        elif op[0] == "finish" and live:
            request_id = live[op[1] % len(live)]
            manager.finish_request(request_id)
            del prompts[request_id]
        elif op[0] == "drop":
            manager.drop_conversation(f"c{op[1]}")
        elif op[0] == "release" and manager.can_release_conversation(f"c{op[1]}"):
            manager.release_conversation(f"c{op[1]}")
            assert manager.retained_turns(f"c{op[1]}") == ()
        elif op[0] == "release_branches":
            manager.release_branch_records(f"c{op[1]}")
            assert all(t.branch_tokens is None for t in manager.retained_turns(f"c{op[1]}"))
        manager.check_integrity()
        check_pages_hold_their_blocks(manager, prompts)
        assert manager.retained_page_count() == count_retained_pages(manager)
    for request_id in list(prompts):
        manager.finish_request(request_id)
    for conversation in range(3):
        manager.drop_conversation(f"c{conversation}")
    manager.check_integrity()
    assert all(pool.num_in_use == 0 for pool in manager.pools.values())


turn_operation = st.one_of(
    st.tuples(st.just("turn"), st.integers(0, 2), st.integers(0, 2), st.integers(2, 10)),
    st.tuples(st.sampled_from(["drop", "release", "release_branches"]), st.integers(0, 2)),
)


@settings(max_examples=80, deadline=None)
@given(
    policy=st.sampled_from(
        ["per_conversation", "per_conversation_root", "per_conversation_branch"]
    ),
    operations=st.lists(turn_operation, max_size=20),
)
def test_retained_page_count_follows_every_retention_change(policy, operations):
    """The retained page count (read by every load report) is cached between retention
    changes: after whole turns, drops and releases it must equal a fresh walk."""
    manager = make_manager(LIFE_CYCLES, 40, BLOCK, POLICIES[policy], checkpoint_margin_tokens=4)
    for number, op in enumerate(operations):
        conversation = f"c{op[1]}"
        if op[0] == "turn":
            # A hinted branch point well before the prompt's end makes a branch record.
            shared = op[3] * BLOCK
            prompt = BASES[op[2]][:shared] + tokens(2000 + number, 20)
            request_id = f"r{number}"
            manager.add_request(request_id, prompt, conversation, branch_hints=[shared])
            for _ in range(4 * len(prompt)):
                if manager.progress(request_id).context_done:
                    break
                step(manager, request_id, len(prompt))
            manager.finish_request(request_id)
        elif op[0] == "drop":
            manager.drop_conversation(conversation)
        elif op[0] == "release" and manager.can_release_conversation(conversation):
            manager.release_conversation(conversation)
        elif op[0] == "release_branches":
            manager.release_branch_records(conversation)
        assert manager.retained_page_count() == count_retained_pages(manager)
    manager.check_integrity()
