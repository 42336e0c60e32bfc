"""The admission's batched calls against their one-by-one forms: a prefix of a hashed sequence
copied (no hashing) against hashing its tokens, a request added from another's prefix against
`add_request`, and the match's walks over the device index in one call against a block-by-block
walk."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kv_factories import make_manager, tokens
from kvfleet.kvstore.block_pool import NULL_PAGE
from kvfleet.kvstore.hashing import SequenceHashes
from kvfleet.kvstore.life_cycles import FullLifeCycle
from kvfleet.kvstore.matching import find_prefix

TOKENS = st.lists(st.integers(0, 2**32 - 1), max_size=40)


@settings(max_examples=100, deadline=None)
@given(
    token_ids=TOKENS,
    block_size=st.integers(1, 5),
    cut=st.integers(0, 40),
    salt=st.sampled_from([b"", b"salt:t"]),
)
def test_a_copied_prefix_equals_hashing_its_tokens(token_ids, block_size, cut, salt):
    cut = min(cut, len(token_ids))
    whole = SequenceHashes(block_size, salt)
    whole.extend(token_ids)
    copied = whole.prefix(cut)
    hashed = SequenceHashes(block_size, salt)
    hashed.extend(token_ids[:cut])
    assert (copied.num_tokens, copied.hashes, copied.root) == (
        hashed.num_tokens,
        hashed.hashes,
        hashed.root,
    )
    for index in range(len(hashed.hashes)):
        assert copied.contents(index) == hashed.contents(index)
        assert copied.block_tokens(index) == tuple(token_ids[index * block_size :][:block_size])
    more = token_ids[::-1]  # both go on alike, and the copy leaves its source alone
    copied.extend(more)
    hashed.extend(more)
    assert copied.hashes == hashed.hashes
    assert whole.num_tokens == len(token_ids)


@settings(max_examples=60, deadline=None)
@given(cached=st.integers(0, 10), length=st.integers(1, 48), cut=st.integers(1, 48))
def test_a_request_added_from_a_prefix_equals_add_request(cached, length, cut):
    manager = make_manager(pages=32)
    base = tokens(1, 48)
    if cached:
        manager.add_request("seen", base[: cached * 4])
        manager.admit("seen", cached * 4)
        manager.commit("seen", cached * 4)
        manager.finish_request("seen")  # its blocks stay cached
    manager.add_request("source", base[:length], "c")
    cut = min(cut, length)
    manager.add_prefix_request("copied", "source", cut)
    manager.add_request("hashed", base[:cut])
    assert manager.match("copied") == manager.match("hashed")
    assert manager.progress("copied") == manager.progress("hashed")
    assert manager.can_admit("copied", 0) == manager.can_admit("hashed", 0)
    manager.finish_request("hashed")
    manager.admit("copied", 0)
    manager.finish_request("copied")
    manager.finish_request("source")
    manager.check_integrity()


@settings(max_examples=100, deadline=None)
@given(
    where=st.lists(st.sampled_from(["device", "host", ""]), min_size=0, max_size=30),
    max_blocks=st.integers(0, 30),
)
def test_the_match_walk_equals_a_block_by_block_walk(where, max_blocks):
    """Blocks on the device, on host or nowhere at any positions: the run from the start, its
    pages (NULL_PAGE where a block is on host) and where each is."""
    manager = make_manager(pages=64)
    pool = manager.pools["full"]
    hashes = [1000 + index for index in range(len(where))]
    for block_hash, tier in zip(hashes, where, strict=True):
        if tier == "device":
            pool.commit(pool.take(1)[0], block_hash)
    on_host = {h for h, tier in zip(hashes, where, strict=True) if tier == "host"}

    def locate(life_cycle, block_hash):
        return "host" if block_hash in on_host else None

    life_cycles = [FullLifeCycle("full")]
    match = find_prefix(hashes, max_blocks, life_cycles, manager.pools, 4, locate)
    run = 0
    while run < min(max_blocks, len(hashes)) and where[run]:
        run += 1
    assert match.num_reusable_blocks == run
    pages = tuple(NULL_PAGE if pool.lookup(h) is None else pool.lookup(h) for h in hashes)
    assert match.pages["full"] == pages[:run]
    assert match.locations["full"] == tuple(where[:run])


pool_operation = st.tuples(
    st.sampled_from(["take", "commit", "ref", "release"]), st.lists(st.integers(0, 5), max_size=6)
)


def pool_state(pool):
    return (
        [pool.ref_count(page) for page in range(pool.num_pages)],
        list(pool._free),
        pool.cached_pages(),
    )


@settings(max_examples=300, deadline=None)
@given(operations=st.lists(pool_operation, max_size=30))
def test_ref_all_and_release_all_equal_one_page_at_a_time(operations):
    """Pages (NULL_PAGE among them) referenced and released in batches: the same ref counts,
    free list and LRU order as page by page, and the same refusal where one is not allowed."""
    batched, single = (make_manager(pages=6).pools["full"] for _ in range(2))
    for number, (kind, pages) in enumerate(operations):
        if kind == "take":
            assert batched.take(min(len(pages), batched.num_available())) == single.take(
                min(len(pages), single.num_available())
            )
            continue
        if kind == "commit":
            for page in pages:
                if page and single.ref_count(page) > 0 and single.page_hash(page) is None:
                    batched.commit(page, 1000 * number + page)
                    single.commit(page, 1000 * number + page)
            continue
        one = single.ref if kind == "ref" else single.release
        failed_single = failed_batched = None
        try:
            for page in pages:
                if page != NULL_PAGE:
                    one(page)
        except ValueError as error:
            failed_single = str(error)
        try:
            (batched.ref_all if kind == "ref" else batched.release_all)(pages)
        except ValueError as error:
            failed_batched = str(error)
        assert failed_batched == failed_single
        assert pool_state(batched) == pool_state(single)
