"""Context + generation through the router: same greedy tokens as aggregated; blocks skipped."""

from __future__ import annotations

import json

import pytest
from disagg_kit import (
    assert_clean,
    metric,
    received_blocks,
    router_generate,
    start_rank,
    start_router,
    tokens,
)
from kvfleet.proto import common_pb2
from kvfleet.services.engine.api.grammar_spec import json_grammar

PROMPT = list(range(1, 100))  # 99 tokens: 6 full blocks of 16 and a partial one


@pytest.fixture(scope="module")
def fleets():
    """An aggregated fleet (one `both` rank) and a disaggregated one (context + generation)."""
    agg_router, agg_address = start_router()
    both = start_rank("both", agg_address)
    dis_router, dis_address = start_router()
    context = start_rank("context", dis_address)
    generation = start_rank("generation", dis_address)
    yield agg_address, dis_address, context, generation
    for rank in (both, context, generation):
        assert_clean(rank)
        rank.stop(grace=0.2)
    for router in (agg_router, dis_router):
        router.runtime.store.check_integrity()
        router.stop(grace=0.2)


def _two_turns(router_address: str, conversation: str, cache_salt: str = ""):
    first = router_generate(router_address, conversation, PROMPT, cache_salt=cache_salt)
    second_prompt = [*PROMPT, *tokens(first), 300, 301, 302]
    second = router_generate(router_address, conversation, second_prompt, cache_salt=cache_salt)
    return first, second


def test_greedy_tokens_through_a_context_and_generation_pair_equal_aggregated(fleets):
    """A hand-off that moved wrong or partial KV would change the greedy continuation."""
    agg_address, dis_address, _context, _generation = fleets
    agg_first, agg_second = _two_turns(agg_address, "eq-agg")
    dis_first, dis_second = _two_turns(dis_address, "eq-dis")
    assert tokens(dis_first) == tokens(agg_first) and len(tokens(agg_first)) == 8
    assert tokens(dis_second) == tokens(agg_second)
    ranks = [r.rank_id for r in dis_first]
    assert ranks[0] == "context" and set(ranks[1:]) == {"generation"}
    assert dis_first[0].chunk.finished is False and dis_first[-1].chunk.finish_reason == "length"
    usage = dis_second[-1].chunk.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (110, 8)
    assert usage.cached_tokens == agg_second[-1].chunk.usage.cached_tokens == 96


def test_a_salted_conversation_hands_off_like_an_unsalted_one(fleets):
    """A hand-off that named blocks without the tenant's salt found no window blocks under
    those ids on the context rank: the salted turn recomputed or failed."""
    agg_address, dis_address, _context, _generation = fleets
    agg_first, agg_second = _two_turns(agg_address, "salt-agg", cache_salt="tenant-a")
    dis_first, dis_second = _two_turns(dis_address, "salt-dis", cache_salt="tenant-a")
    assert tokens(dis_first) == tokens(agg_first) and tokens(dis_second) == tokens(agg_second)
    assert dis_first[0].rank_id == "context" and dis_first[-1].rank_id == "generation"
    usage = dis_second[-1].chunk.usage
    assert usage.cached_tokens == agg_second[-1].chunk.usage.cached_tokens == 96


def test_second_turn_skips_the_blocks_the_generation_rank_already_holds(fleets):
    """Without skipping, every turn would move the whole conversation's KV again."""
    _, dis_address, _context, generation = fleets
    skipped_before = metric(generation, "kvfleet_engine_handoff_blocks_skipped_total")
    received_before = received_blocks(generation)
    prompt = [token + 100 for token in PROMPT]  # a prefix no rank has seen yet
    first = router_generate(dis_address, "skip", prompt)
    after_first = metric(generation, "kvfleet_engine_handoff_blocks_skipped_total")
    router_generate(dis_address, "skip", [*prompt, *tokens(first), 300, 301, 302])
    skipped = metric(generation, "kvfleet_engine_handoff_blocks_skipped_total") - after_first
    received = (
        metric(
            generation,
            "kvfleet_engine_handoff_blocks_total",
            direction="received",
            transport="grpc",
        )
        - received_before
    )
    # Turn 1: nothing held. Turn 2 (110 tokens) reuses 6 full blocks: 6 `full` blocks and the
    # 4 `window` blocks (window 64 = 4 blocks) before block 6 are held, so 10 are skipped.
    assert after_first - skipped_before == 0
    assert skipped == 10
    # Moved: turn 1 all 7 `full` + 7 `window` blocks (checkpoint and endpoint windows, the
    # partial block); turn 2 blocks 6 (now full) of both, each life cycle.
    assert received == 14 + 2


def test_a_constrained_turn_keeps_its_grammar_across_the_hand_off(fleets):
    """The context rank samples the first token under the grammar, the generation rank steps
    the same grammar past it: the answer is the JSON asked for, ended at the grammar's end."""
    _, dis_address, _context, _generation = fleets
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    sampling = common_pb2.SamplingParams(temperature=0.0, grammar=json_grammar(schema, "schema"))
    responses = router_generate(dis_address, "json-dis", PROMPT, 40, sampling)
    ranks = [r.rank_id for r in responses]
    assert ranks[0] == "context" and set(ranks[1:]) == {"generation"}
    text = bytes(t for t in tokens(responses) if t < 256).decode()
    assert json.loads(text) in ({"ok": True}, {"ok": False})
    assert responses[-1].chunk.finish_reason == "stop"
