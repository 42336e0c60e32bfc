"""A generation rank whose window pool is far smaller than the prompt still takes the hand-off.

The tiny model's window is 64 tokens (4 blocks of 16). An 800-token prompt has 50 blocks; the
generation rank has 13 window pages (12 usable: the least the engine accepts for a window, a
chunk and a checkpoint), so pages for every prompt block cannot fit. It needs the live window
at 800 (blocks 46..49), the endpoint window (46..49) and the checkpoint window at 768 (blocks
44..47): 6 pages, then decode pages as the window slides.
"""

from __future__ import annotations

import pytest
from disagg_kit import (
    address,
    assert_clean,
    engine_request,
    engine_stub,
    received_blocks,
    start_rank,
    tokens,
)
from kvfleet.services.disagg.context_side import prompt_hashes

PROMPT = [(7 * i) % 250 + 1 for i in range(800)]  # 50 blocks of 16
WINDOW_PAGES = 13  # null page included


@pytest.fixture(scope="module")
def ranks():
    """An aggregated rank, a context rank and a generation rank with a small window pool."""
    both = start_rank("both", rank_id="both")
    context = start_rank("context", rank_id="context")
    generation = start_rank(
        "generation", rank_id="generation", kv_pool_pages=(("window", WINDOW_PAGES),)
    )
    yield both, context, generation
    for rank in (both, context, generation):
        assert_clean(rank)
        rank.stop(grace=0.2)


def _generate(rank, request_id: str, max_tokens: int = 8, **fields):
    channel, stub = engine_stub(rank)
    with channel:
        request = engine_request(request_id, PROMPT, max_tokens, **fields)
        return list(stub.Generate(request, timeout=60))


def test_handoff_into_a_window_pool_smaller_than_the_prompt_decodes_like_aggregated(ranks):
    """Pages for every prompt block would refuse this hand-off; wrong pages would change tokens."""
    both, context, generation = ranks
    pool = generation.core.manager.pools["window"]
    assert pool.num_usable == WINDOW_PAGES - 1 < len(PROMPT) // 16
    aggregated = tokens(_generate(both, "agg", conversation_id="small-agg"))
    first = _generate(context, "dis", conversation_id="small-dis")
    assert [c.finish_reason for c in first] == ["handoff"]
    decoded = _generate(
        generation,
        "dis",
        kv_source_address=address(context),
        handoff_token_ids=list(first[0].token_ids),
        conversation_id="small-dis",
    )
    assert tokens(first) + tokens(decoded) == aggregated and len(aggregated) == 8
    # Received: all 50 `full` blocks; `window` blocks 44..49 (checkpoint and live windows).
    assert received_blocks(generation) == 50 + 6
    # Retained: the turn's endpoint window (46..49) and checkpoint window (44..47), each page
    # committed under its block's hash.
    manager = generation.core.manager
    kept = generation.core.call_on_core(lambda: manager.retained_turns("small-dis"))
    held = generation.core.call_on_core(
        lambda: sorted(pool.page_hash(page) for page in kept[0].pages["window"])
    )
    assert len(kept) == 1 and held == sorted(prompt_hashes(tuple(PROMPT), 16)[44:50])
    generation.core.check_integrity()
