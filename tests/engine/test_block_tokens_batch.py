"""`BlockTokens.extend_all`, a decode step's tokens in one call, against `extend` per token: the
same blocks remembered (parent, first, tokens), so the same `stored` events go to the router;
a key that starts a new sequence right after its last one retired; and the engine's tracker,
which reads the kvstore's records, against one that hashes by itself."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.events import KVEvent, KVEventKind
from kvfleet.kvstore.hashing import block_hashes, root_hash
from kvfleet.kvstore.life_cycles import FullLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import PerRequest
from kvfleet.services.engine.config.model_config import FULL_GROUP
from kvfleet.services.engine.core.kv_events import BlockEvent, BlockTokens


def make_manager(pages: int, block_size: int) -> KVCacheManager:
    config = KVStoreConfig(
        block_size=block_size,
        life_cycles=(FullLifeCycle("full"),),
        pool_pages={"full": pages},
        reuse_policy=PerRequest(),
    )
    return KVCacheManager(config)


TOKENS = st.integers(0, 2**32 - 1)


def stored_events(*prompts, block_size, extra_key=b""):
    """A `stored` event for every full block of each token list."""
    return [
        KVEvent(KVEventKind.STORED, FULL_GROUP, block_hash)
        for prompt in prompts
        for block_hash in block_hashes(prompt, block_size, extra_key)
    ]


def expected(prompt, block_size, extra_key=b""):
    """The events the router must get for `prompt`'s blocks: parent (root for the first) and
    tokens of each."""
    hashes = block_hashes(prompt, block_size, extra_key)
    out = []
    for index, block_hash in enumerate(hashes):
        tokens = tuple(prompt[index * block_size : (index + 1) * block_size])
        if index == 0:
            out.append(
                BlockEvent(KVEventKind.STORED, block_hash, None, tokens, root_hash(extra_key))
            )
        else:
            out.append(BlockEvent(KVEventKind.STORED, block_hash, hashes[index - 1], tokens))
    return out


@settings(max_examples=100, deadline=None)
@given(
    prompts=st.lists(st.lists(TOKENS, max_size=11), min_size=1, max_size=4),
    steps=st.lists(st.lists(TOKENS, min_size=4, max_size=4), max_size=12),
    block_size=st.integers(1, 4),
)
def test_extend_all_equals_extend_per_token(prompts, steps, block_size):
    batched, single = BlockTokens(block_size), BlockTokens(block_size)
    keys = [f"s{i}" for i in range(len(prompts))]
    salts = [b"salt" if key == "s0" else b"" for key in keys]
    for tracker in (batched, single):
        for key, prompt, salt in zip(keys, prompts, salts, strict=True):
            tracker.extend(key, prompt, salt)
    sequences = [list(prompt) for prompt in prompts]
    for sampled in steps:
        picked = sampled[: len(keys)]
        batched.extend_all(keys, picked)
        for key, token, sequence in zip(keys, picked, sequences, strict=True):
            single.extend(key, [token])
            sequence.append(token)
    for sequence, salt in zip(sequences, salts, strict=True):
        stored = stored_events(sequence, block_size=block_size, extra_key=salt)
        assert batched.translate(stored) == single.translate(stored)
        assert single.translate(stored) == expected(sequence, block_size, salt)


def test_a_key_reused_before_the_next_translate_tracks_the_new_sequence():
    """If this fails, a request id that a client sends again right after its last request
    finished (before the engine flushed its events) loses its new sequence at the flush, and
    the next decode step's tokens fail the whole engine step (a KeyError in `extend_all`)."""
    tracker = BlockTokens(2)
    tracker.extend("g0#0", [1, 2, 3])
    tracker.retire("g0#0")
    tracker.extend("g0#0", [7, 8, 9])  # the same id again, before any translate
    stored = tracker.translate(stored_events([1, 2, 3], block_size=2))
    assert stored[0].token_ids == (1, 2)  # the old sequence's last commit still names its tokens
    tracker.extend_all(["g0#0"], [10])
    new = tracker.translate(stored_events([7, 8, 9, 10], block_size=2))
    assert [event.token_ids for event in new] == [(7, 8), (9, 10)]
    assert tracker.translate(stored_events([1, 2, 3], block_size=2)) == []  # forgotten


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.lists(TOKENS, max_size=11), min_size=1, max_size=3),
    steps=st.lists(st.lists(TOKENS, min_size=3, max_size=3), max_size=10),
    preempt_at=st.integers(0, 10),
)
def test_the_kvstores_records_name_the_same_blocks(prompts, steps, preempt_at):
    """The engine's tracker reads the kvstore's records (the prompt hashed once): the events
    must be those of a tracker that hashes by itself, also after the kvstore tracks a
    preempted sequence anew (its prompt and output so far, in a new record)."""
    block_size = 2
    manager = make_manager(pages=64, block_size=block_size)
    shared, own = BlockTokens(block_size, manager.sequence_hashes), BlockTokens(block_size)
    keys = [f"s{i}" for i in range(len(prompts))]
    sequences = [[*prompt, 5] for prompt in prompts]  # no empty prompt
    for key, sequence in zip(keys, sequences, strict=True):
        manager.add_request(key, sequence)
        shared.extend(key, sequence)
        own.extend(key, sequence)
    for number, sampled in enumerate(steps):
        if number == preempt_at:
            manager.finish_request(keys[0])
            manager.add_request(keys[0], sequences[0])
        picked = sampled[: len(keys)]
        manager.append_tokens_all(keys, picked)
        shared.extend_all(keys, picked)
        own.extend_all(keys, picked)
        for token, sequence in zip(picked, sequences, strict=True):
            sequence.append(token)
    for sequence in sequences:
        stored = stored_events(sequence, block_size=block_size)
        assert shared.translate(stored) == own.translate(stored) == expected(sequence, block_size)
