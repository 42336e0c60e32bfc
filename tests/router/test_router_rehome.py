"""Re-homing: a pinned turn whose home lost most of its prefix is placed as a new conversation.

A rank whose pinned conversations outgrow its KV thrashes among them turn after turn (the
hardware fleet replay of docs/sim-vs-live.md); a turn whose home kept only the start of its
prompt loses little by leaving, and the home is relieved. The prefix index says how much the
home holds; an index that never saw the prompt's start on the home says nothing.
"""

from __future__ import annotations

import pytest
from kvfleet.services.router.admission import REHOME_MIN_BLOCKS, AdmissionConfig, AdmissionQueue
from kvfleet.services.router.model import PendingRequest, Placement, RankInfo, RankLoad
from kvfleet.services.router.prefix_index import PrefixIndex
from kvfleet.services.router.store import LocalStore

BLOCK = 4
PROMPT = tuple(range(1, 1 + BLOCK * 2 * REHOME_MIN_BLOCKS))  # 128 blocks
BLOCKS = len(PROMPT) // BLOCK


def admit(clock, held_blocks: int, rehome_below: float, prompt=PROMPT, home_leaving=False):
    """The admission of conversation `c` (pinned on `a`, which holds its first `held_blocks`
    blocks in the index and is busier than `b`)."""
    store, index = LocalStore(), PrefixIndex()
    for rank_id in ("a", "b"):
        store.register_rank(RankInfo(rank_id, rank_id, 2, block_size=BLOCK), clock())
    assert store.try_admit("a", "earlier-turn", 1, "c", 3600.0, clock())
    store.release("a", "earlier-turn")
    assert store.try_admit("a", "busy", 1, "other", 3600.0, clock())  # `b` is the idler rank
    if home_leaving:
        store.heartbeat("a", RankLoad(leaving=True), clock())
    if held_blocks:
        hashes = list(range(100, 100 + held_blocks))
        index.stored("a", hashes, None, PROMPT[: held_blocks * BLOCK], BLOCK)
    config = AdmissionConfig(rehome_below=rehome_below)
    queue = AdmissionQueue(store, config, clock, index)
    queue.enqueue(PendingRequest("turn", "c", clock(), prompt_tokens=prompt))
    (admission,) = queue.run_pass().admitted
    assert store.get_pins(["c"], clock()) == {"c": admission.rank.rank_id}  # pinned where it ran
    store.check_integrity()
    return admission


def placed(clock, held_blocks: int, rehome_below: float, prompt=PROMPT) -> tuple[str, Placement]:
    """Where conversation `c` lands, and why (see `admit`)."""
    admission = admit(clock, held_blocks, rehome_below, prompt)
    return admission.rank.rank_id, admission.placement


@pytest.mark.parametrize(
    ("held", "share", "where"),
    [
        (BLOCKS // 8, 0.5, ("b", Placement.REHOMED)),  # home kept an eighth: placed anew
        (BLOCKS // 8, 0.0, ("a", Placement.PINNED)),  # off
        (BLOCKS * 3 // 4, 0.5, ("a", Placement.PINNED)),  # home holds most of it
        (0, 0.5, ("a", Placement.PINNED)),  # the index never saw the start: it says nothing
    ],
)
def test_a_turn_leaves_a_home_that_lost_most_of_its_prefix(clock, held, share, where):
    """Without it a thrashing home keeps every conversation and reuses a sliver of each; with
    an index that knows nothing (a restarted router) every long turn would leave its home."""
    assert placed(clock, held, share) == where


def test_a_leaving_home_is_named_even_where_it_lost_most_of_the_prefix(clock):
    """A turn leaving a shutting-down home pulls what the home still holds: re-homing, which
    names no home, must not take it first."""
    admission = admit(clock, BLOCKS // 8, 0.5, home_leaving=True)
    assert admission.rank.rank_id == "b"
    assert admission.home is not None and admission.home.rank_id == "a"


def test_short_prompts_stay_home(clock):
    """A prompt under REHOME_MIN_BLOCKS blocks costs little to recompute where it is."""
    short = PROMPT[: BLOCK * (REHOME_MIN_BLOCKS - 1)]
    assert placed(clock, 2, 0.5, short) == ("a", Placement.PINNED)


def test_a_share_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="rehome_below"):
        AdmissionConfig(rehome_below=1.5)
