"""A turn moved off its home pulls the home's prefix over the hand-off transport (real ranks).

Rank A serves turn 1 of a conversation (150 tokens, pages of 16) and retains what a resume at
its prompt end needs: full blocks 0..8, window blocks 5..8 (endpoint) and 3..6 (checkpoint; the
tiny model's window is 4 blocks). Turn 2 (turn 1 + 8 output + 37 tokens) is sent to rank B
naming A as its home: B pulls those 9 + 6 blocks, holds them, and turn 2 reuses 144 tokens.
"""

from __future__ import annotations

import random

import grpc
import pytest
from disagg_kit import (
    address,
    assert_clean,
    engine_request,
    engine_stub,
    metric,
    start_rank,
    tokens,
)
from kvfleet.proto import common_pb2, engine_pb2

RETAINED_BLOCKS = 9 + 6
RESUMED_TOKENS = 9 * 16
MOVED = "kvfleet_engine_moved_turns_total"
MOVED_BLOCKS = "kvfleet_engine_moved_blocks_total"


@pytest.fixture(scope="module")
def ranks():
    """Home, the rank turns move to, and a reference rank that never reuses across tests."""
    started = [start_rank("both", rank_id=name) for name in ("home", "new", "reference")]
    yield started
    for rank in started:
        rank.stop(grace=0)


def _generate(rank, request) -> list:
    channel, stub = engine_stub(rank)
    with channel:
        return list(stub.Generate(request, timeout=60))


def _turns(seed: int, home) -> tuple[list[int], list[int]]:
    """Turn 1 served on `home`; the prompts of turns 1 and 2."""
    rng = random.Random(seed)
    first = [rng.randrange(256) for _ in range(150)]
    out = tokens(_generate(home, engine_request(f"s{seed}-t1", first, conversation_id=f"c{seed}")))
    return first, first + out + [rng.randrange(256) for _ in range(37)]


def _reference(rank, seed: int, prompt: list[int]) -> list[int]:
    """Greedy tokens of `prompt` computed from scratch (a conversation nobody else has)."""
    chunks = _generate(rank, engine_request(f"s{seed}-ref", prompt, conversation_id=f"r{seed}"))
    assert chunks[-1].usage.cached_tokens == 0
    return tokens(chunks)


def _outcomes(rank) -> dict[str, float]:
    kinds = ("pulled", "nothing", "failed", "missing", "no_room")
    return {
        kind: metric(rank, MOVED, outcome=kind)
        for kind in kinds
        if metric(rank, MOVED, outcome=kind)
    }


def test_a_moved_turn_reuses_its_homes_prefix_and_decodes_the_same(ranks):
    """Without the pull the moved turn recomputes 144 tokens; with stale bytes it decodes other
    tokens than the same prompt computed from scratch."""
    home, new, reference = ranks
    _, second = _turns(1, home)
    before = metric(new, MOVED_BLOCKS, direction="received")
    request = engine_request("s1-t2", second, conversation_id="c1", kv_home_address=address(home))
    chunks = _generate(new, request)
    assert chunks[-1].usage.cached_tokens == RESUMED_TOKENS
    assert metric(new, MOVED_BLOCKS, direction="received") - before == RETAINED_BLOCKS
    assert tokens(chunks) == _reference(reference, 1, second)
    for rank in ranks:
        assert_clean(rank)


def test_only_blocks_the_new_rank_lacks_move(ranks):
    """A pull that ignored what the new rank holds would move the shared first blocks again."""
    home, new, _ = ranks
    first, second = _turns(2, home)
    # Another conversation on the new rank shares the first 4 blocks (a system prompt).
    shared = first[:64] + [7] * 40
    _generate(new, engine_request("s2-other", shared, conversation_id="other2"))
    before = metric(new, MOVED_BLOCKS, direction="received")
    request = engine_request("s2-t2", second, conversation_id="c2", kv_home_address=address(home))
    assert _generate(new, request)[-1].usage.cached_tokens == RESUMED_TOKENS
    # full blocks 4..8, window blocks 4..8 (endpoint 5..8, checkpoint 3..6, past the held 4)
    assert metric(new, MOVED_BLOCKS, direction="received") - before == 5 + 5
    assert_clean(new)


def test_a_home_that_is_gone_costs_only_the_recompute(ranks):
    """A failed pull must neither fail the turn nor leave a request holding pages."""
    home, new, reference = ranks
    _, second = _turns(3, home)
    failed = metric(new, MOVED, outcome="failed")
    # Nothing listens on port 1: the pull is refused at once.
    request = engine_request("s3-t2", second, conversation_id="c3", kv_home_address="127.0.0.1:1")
    chunks = _generate(new, request)
    assert chunks[-1].usage.cached_tokens == 0
    assert metric(new, MOVED, outcome="failed") == failed + 1
    assert tokens(chunks) == _reference(reference, 3, second)
    assert_clean(new)


def test_a_home_without_the_prefix_sends_nothing(ranks):
    """A conversation the home never served: no block moves, the turn is served as new."""
    home, new, _ = ranks
    nothing = metric(new, MOVED, outcome="nothing")
    prompt = [random.Random(4).randrange(256) for _ in range(100)]
    request = engine_request("s4", prompt, conversation_id="c4", kv_home_address=address(home))
    assert _generate(new, request)[-1].usage.cached_tokens == 0
    assert metric(new, MOVED, outcome="nothing") == nothing + 1
    assert_clean(new)


@pytest.mark.parametrize(
    ("address_value", "field"),
    [
        ("no-port", "kv_home_address"),
        ("host:99999", "kv_home_address"),
        ("h:" + "1" * 300, "kv_home_address"),
    ],
)
def test_a_bad_home_address_is_invalid_argument(ranks, address_value, field):
    """A malformed address must be refused naming the field, not dialled."""
    _, new, _ = ranks
    request = engine_request("bad", [1, 2, 3], conversation_id="c5", kv_home_address=address_value)
    with pytest.raises(grpc.RpcError) as error:
        _generate(new, request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(field)


def _pull(rank, **fields) -> list:
    channel, stub = engine_stub(rank)
    with channel:
        return list(stub.PullKvBlocks(engine_pb2.KvPullRequest(**fields), timeout=30))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"prompt_token_ids": common_pb2.TokenIds(ids=[])}, "prompt_token_ids"),
        ({"prompt_token_ids": common_pb2.TokenIds(ids=[1] * 5000)}, "prompt_token_ids"),
        (
            {"prompt_token_ids": common_pb2.TokenIds(ids=[1, 2]), "cache_salt": "s" * 300},
            "cache_salt",
        ),
    ],
)
def test_a_bad_prefix_pull_is_invalid_argument(ranks, fields, field):
    """The home refuses what it never serves, naming the field."""
    home = ranks[0]
    with pytest.raises(grpc.RpcError) as error:
        _pull(home, request_id="p", **fields)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(field)


def test_held_hashes_of_another_prompt_are_refused(ranks):
    """Blocks after a prefix the receiver does not share would be another prompt's KV."""
    home = ranks[0]
    with pytest.raises(grpc.RpcError) as error:
        _pull(home, prompt_token_ids=common_pb2.TokenIds(ids=list(range(64))), block_hashes=[12345])
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
