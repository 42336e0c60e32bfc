"""Persistent device page tables (kv/page_tables.py) kept from the kvstore manager's changes:
after any call order they equal tables rebuilt from scratch, and decode steps through them give
the eager step's greedy tokens, with and without the prefix cache."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from engine_testkit import TEST_CONFIG, greedy, make_core, tokens_of
from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.kvstore.block_pool import NULL_PAGE
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import (
    FullLifeCycle,
    PrivateLifeCycle,
    StateLifeCycle,
    WindowLifeCycle,
)
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import REUSE_POLICIES
from kvfleet.services.engine.kv.page_tables import NULL_ROW, PersistentPageTables
from kvfleet.services.engine.request.engine_request import GenerateCall

BLOCK, WIDTH = 4, 64
LIFE_CYCLES = (
    FullLifeCycle("full"),
    WindowLifeCycle("swa", 8, replay_tokens=4),
    StateLifeCycle("ssm", every_tokens=8),
    PrivateLifeCycle("scratch"),
    WindowLifeCycle("draft", 4, required=False),
)
BASES = [np.random.default_rng(seed).integers(0, 50_000, 40).tolist() for seed in range(3)]


def _manager(policy: str, pages: int) -> KVCacheManager:
    config = KVStoreConfig(
        block_size=BLOCK,
        life_cycles=LIFE_CYCLES,
        pool_pages={lc.name: pages for lc in LIFE_CYCLES},
        reuse_policy=REUSE_POLICIES[policy](),
        checkpoint_margin_tokens=4,
    )
    return KVCacheManager(config)


def _step(manager: KVCacheManager, request_id: str, prompt_len: int, chunk: int = 8) -> None:
    """Admit, a prefill chunk, or a decode token (window pages slide out at each commit)."""
    progress = manager.progress(request_id)
    if not progress.admitted:
        reused = manager.match(request_id).num_reusable_tokens
        size = min(chunk, prompt_len - reused)
        if manager.can_admit(request_id, size):
            manager.admit(request_id, size)
            manager.commit(request_id, reused + size)
    elif progress.num_computed_tokens < prompt_len:
        size = min(chunk, prompt_len - progress.num_computed_tokens)
        if manager.can_allocate(request_id, size):
            manager.allocate(request_id, size)
            manager.commit(request_id, progress.num_computed_tokens + size)
    elif manager.can_allocate(request_id, 1):
        manager.allocate(request_id, 1)
        manager.append_tokens(request_id, [3])
        manager.commit(request_id, progress.num_computed_tokens + 1)
    progress = manager.progress(request_id)
    if progress.num_computed_tokens >= prompt_len and not progress.context_done:
        manager.finish_context(request_id)


def _decode_all(manager: KVCacheManager, request_ids: list[str]) -> None:
    """One decode step of every decoding request in one call (`allocate_all`)."""
    decoding = [
        r
        for r in request_ids
        if manager.progress(r).context_done
        and manager.progress(r).num_computed_tokens < WIDTH * BLOCK - 8
    ]
    if decoding and manager.can_allocate_all(decoding, 1):
        manager.allocate_all(decoding, 1)
        for request_id in decoding:
            manager.append_tokens(request_id, [5])
            manager.commit(request_id, manager.progress(request_id).num_computed_tokens + 1)


def assert_tables_rebuilt_from_scratch(tables: PersistentPageTables, manager: KVCacheManager):
    """Host mirror and device tables equal the manager's tables laid into fresh null rows."""
    admitted = [r for r in manager.request_ids() if manager.progress(r).admitted]
    rows = dict(zip(admitted, tables.rows_of(admitted).tolist(), strict=True))
    assert len(set(rows.values())) == len(rows) and NULL_ROW not in rows.values()
    for group in tables.groups:
        expected = np.full((tables.slots + 1, WIDTH), NULL_PAGE, dtype=np.int32)
        for request_id, row in rows.items():
            table = manager.page_table(request_id, group)
            expected[row, : len(table)] = table
        np.testing.assert_array_equal(tables.host[group], expected, err_msg=group)
        np.testing.assert_array_equal(tables.device_tables[group].numpy(), expected, group)


operation = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.integers(0, 2), st.integers(1, 40)),
    # a request's next steps: prefill chunks of 1-16 tokens, then decode tokens
    st.tuples(
        st.just("step"),
        st.integers(0, 50),
        st.integers(1, 40),
        st.sampled_from([1, 4, 8, 16]),
        st.booleans(),  # an update after each step, as the engine's decode steps do
    ),
    st.tuples(st.just("decode_all"), st.integers(1, 12)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("preempt"), st.integers(0, 50)),
    st.tuples(st.sampled_from(["drop", "release"]), st.integers(0, 2)),
    st.tuples(st.just("update"), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(
    policy=st.sampled_from(["per_conversation", "per_request", "all_reusable"]),
    pages=st.integers(12, 40),
    slots=st.integers(1, 4),
    watch_late=st.integers(0, 6),
    operations=st.lists(operation, max_size=50),
)
def test_tables_kept_from_changes_equal_tables_rebuilt(
    policy, pages, slots, watch_late, operations
):
    """Admissions (with reuse), prefill, decode one by one and all at once, window and state
    pages sliding out, context ends (kept pages released), finishes, preemptions with their
    resume, retention dropped or released: after each update the kept tables are rebuilt ones.
    The tables may start watching after requests were admitted, and grow past `slots` rows."""
    manager = _manager(policy, pages)
    tables = None
    prompts: dict[str, list[int]] = {}
    for number, op in enumerate(operations):
        if number == watch_late:
            watch = manager.watch_page_tables()
            tables = PersistentPageTables(
                manager.life_cycles, WIDTH, slots, NULL_PAGE, torch.device("cpu"), watch
            )
        live = sorted(prompts)
        if op[0] == "add":
            _, conversation, base, length = op
            prompt = [*BASES[base][:length], number, 7, 8]
            manager.add_request(f"r{number}", prompt, f"c{conversation}")
            prompts[f"r{number}"] = prompt
        elif op[0] == "step" and live:
            request_id = live[op[1] % len(live)]
            for _ in range(op[2]):
                _step(manager, request_id, len(prompts[request_id]), op[3])
                if tables is not None and op[4]:
                    tables.update()
                    assert_tables_rebuilt_from_scratch(tables, manager)
        elif op[0] == "decode_all":
            for _ in range(op[1]):
                _decode_all(manager, live)
        elif op[0] == "finish" and live:
            request_id = live[op[1] % len(live)]
            manager.finish_request(request_id)
            del prompts[request_id]
        elif op[0] == "preempt" and live:
            # The scheduler's preemption: forget the request, re-add it with what it computed;
            # it resumes from whatever prefix is still cached.
            request_id = live[op[1] % len(live)]
            computed = manager.progress(request_id).num_computed_tokens
            prompt = (prompts[request_id] + [9] * computed)[: max(computed, 1)]
            manager.finish_request(request_id)
            manager.add_request(request_id, prompt, "c0")
            prompts[request_id] = prompt
            _step(manager, request_id, len(prompt))
        elif op[0] == "drop":
            manager.drop_conversation(f"c{op[1]}")
        elif op[0] == "release" and manager.can_release_conversation(f"c{op[1]}"):
            manager.release_conversation(f"c{op[1]}")
        if tables is not None and op[0] == "update":
            tables.update()
            assert_tables_rebuilt_from_scratch(tables, manager)
    if tables is not None:
        tables.update()
        assert_tables_rebuilt_from_scratch(tables, manager)


@pytest.mark.parametrize("policy", ["per_conversation", "per_request", "all_reusable"])
def test_pages_kept_until_context_end_leave_the_kept_tables_when_released(policy):
    """A window's endpoint pages are kept past their slide-out until the context ends; a table
    updated after every one-token step must drop them at the end, with nothing else changing
    in that step's window (the random calls above rarely line that up)."""
    for prompt_len in range(20, 44):
        manager = _manager(policy, 40)
        watch = manager.watch_page_tables()
        tables = PersistentPageTables(
            manager.life_cycles, WIDTH, 2, NULL_PAGE, torch.device("cpu"), watch
        )
        manager.add_request("r", BASES[0][:prompt_len], "c0")
        for _ in range(prompt_len + 4):
            _step(manager, "r", prompt_len, chunk=1)
            tables.update()
            assert_tables_rebuilt_from_scratch(tables, manager)
        assert manager.progress("r").context_done


# -- the serving path --------------------------------------------------------------------------

# Tight pools (preemption), a window of 64 tokens that prompts and outputs outgrow (pages slide
# out while decoding), retained conversations (their turns resume from the cache).
TIGHT = TEST_CONFIG.with_changes(kv_pages=44, reuse_policy="per_conversation")
PERSISTENT = TIGHT.with_changes(decode_graphs="static", overlap_decode=True)
EAGER = TIGHT.with_changes(decode_graphs="off")


def _serve_conversations(config, storage: str, reference=None):
    """Three conversations at once, three turns each (each turn resends the last prompt, its
    output and 30 new tokens); every turn's output, the second and third turns' cached tokens,
    the core's preemptions and what the persistent tables saw."""
    core = make_core(config, storage=storage)
    seen = {"updates": 0, "slid_out": 0}
    runner = core.compute.decode
    if runner is not None:
        original = runner.tables.update

        def update():
            written = original()
            seen["updates"] += written > 0
            window = runner.tables.host["window"]
            used = runner.tables._used
            seen["slid_out"] += sum(
                int((window[row, : used[row]] == NULL_PAGE).any()) for row in range(1, len(used))
            )
            return written

        runner.tables.update = update
    rng = random.Random(5)
    prompts = [[rng.randrange(256) for _ in range(70 + 20 * c)] for c in range(3)]
    outputs, cached = [], []
    try:
        for turn in range(3):
            calls = [
                GenerateCall(f"c{c}-t{turn}", tuple(p), greedy(40), f"c{c}")
                for c, p in enumerate(prompts)
            ]
            handles = [core.submit(call) for call in calls]
            for c, handle in enumerate(handles):
                out = list(handle.outputs(120))
                outputs.append(tokens_of(out))
                if turn:
                    cached.append(out[-1].usage.cached_tokens)
                prompts[c] = prompts[c] + tokens_of(out) + [rng.randrange(256) for _ in range(30)]
        core.check_integrity()
        core.call_on_core(core.compute.cache.check_integrity)
        preemptions = core.scheduler.preemptions
    finally:
        core.stop()
    return outputs, cached, preemptions, seen


def _without_cache(config, storage: str, calls_of) -> list[list[int]]:
    """Each call alone on a fresh core (an empty prefix cache)."""
    outputs = []
    for call in calls_of:
        core = make_core(config, storage=storage)
        try:
            outputs.append(tokens_of(list(core.submit(call).outputs(120))))
        finally:
            core.stop()
    return outputs


def test_greedy_output_through_persistent_tables_equals_eager_without_cache():
    """Decode steps planned ahead through the persistent tables (pages sliding out of windows,
    sequences preempted and resumed, retained turns reused) give the tokens of the eager step,
    and of each request computed alone on an empty cache."""
    persistent, cached, preemptions, seen = _serve_conversations(PERSISTENT, "pt-persistent")
    eager, eager_cached, _, _ = _serve_conversations(EAGER, "pt-eager")
    assert persistent == eager
    assert all(count > 0 for count in cached + eager_cached), (cached, eager_cached)
    assert preemptions > 0
    assert seen["updates"] > 0 and seen["slid_out"] > 0
    # Without the prefix cache: the same prompts, each computed from scratch.
    rng = random.Random(5)
    prompts = [[rng.randrange(256) for _ in range(70 + 20 * c)] for c in range(3)]
    calls = []
    for turn in range(3):
        for c in range(3):
            calls.append(GenerateCall(f"c{c}-t{turn}", tuple(prompts[c]), greedy(40), f"c{c}"))
            out = persistent[3 * turn + c]
            prompts[c] = prompts[c] + out + [rng.randrange(256) for _ in range(30)]
    assert _without_cache(PERSISTENT, "pt-fresh", calls) == persistent
