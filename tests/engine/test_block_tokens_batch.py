"""`BlockTokens.extend_all`, a decode step's tokens in one call, against `extend` per token: the
same blocks remembered (parent, first, tokens), so the same `stored` events go to the router;
and a key that starts a new sequence right after its last one retired."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.kvstore.events import KVEvent, KVEventKind
from kvfleet.services.engine.config.model_config import FULL_GROUP
from kvfleet.services.engine.core.kv_events import BlockTokens

TOKENS = st.integers(0, 2**32 - 1)


@settings(max_examples=100, deadline=None)
@given(
    prompts=st.lists(st.lists(TOKENS, max_size=11), min_size=1, max_size=4),
    steps=st.lists(st.lists(TOKENS, min_size=4, max_size=4), max_size=12),
    block_size=st.integers(1, 4),
)
def test_extend_all_equals_extend_per_token(prompts, steps, block_size):
    batched, single = BlockTokens(block_size), BlockTokens(block_size)
    keys = [f"s{i}" for i in range(len(prompts))]
    for tracker in (batched, single):
        for key, prompt in zip(keys, prompts, strict=True):
            tracker.extend(key, prompt, b"salt" if key == "s0" else b"")
    for sampled in steps:
        picked = sampled[: len(keys)]
        batched.extend_all(keys, picked)
        for key, token in zip(keys, picked, strict=True):
            single.extend(key, [token])
    assert batched._blocks == single._blocks
    stored = [KVEvent(KVEventKind.STORED, FULL_GROUP, h) for h in single._blocks]
    assert batched.translate(stored) == single.translate(stored)


def test_a_key_reused_before_the_next_translate_tracks_the_new_sequence():
    """If this fails, a request id that a client sends again right after its last request
    finished (before the engine flushed its events) loses its new sequence at the flush, and
    the next decode step's tokens fail the whole engine step (a KeyError in `extend_all`)."""
    tracker = BlockTokens(2)
    tracker.extend("g0#0", [1, 2, 3])
    old_block = next(iter(tracker._blocks))
    tracker.retire("g0#0")
    tracker.extend("g0#0", [7, 8, 9])  # the same id again, before any translate
    stored = tracker.translate([KVEvent(KVEventKind.STORED, FULL_GROUP, old_block)])
    assert stored[0].token_ids == (1, 2)  # the old sequence's last commit still names its tokens
    tracker.extend_all(["g0#0"], [10])
    assert (7, 8) in {tokens for _, _, tokens in tracker._blocks.values()}
    assert (9, 10) in {tokens for _, _, tokens in tracker._blocks.values()}
    assert (1, 2) not in {tokens for _, _, tokens in tracker._blocks.values()}
