"""`BlockTokens.extend_all`, a decode step's tokens in one call, against `extend` per token: the
same blocks remembered (parent, first, tokens), so the same `stored` events go to the router."""

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
