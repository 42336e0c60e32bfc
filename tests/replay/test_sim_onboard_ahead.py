"""A long host prefix comes up in pieces before its request joins, as the engine brings it up."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
from kvfleet.kvstore.results import PrefixMatch
from kvfleet.services.core.cost_model import CostModel
from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.model import Conversation, Turn
from kvfleet.services.replay.runner import run_arm
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_dispatch import admission_seconds
from kvfleet.services.replay.sim_onboard_ahead import OnboardAhead
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.tokens import TokenSynthesizer

BLOCK = 64
HYBRID = Path(__file__).resolve().parents[2] / "bench" / "sim_hybrid.yaml"
PREFIX_BLOCKS = 40  # b's first turn: what its second turn finds on the host tier
PER_PAGE_MS = 10.0  # the admission's figure per host page (large: the pauses stand out)


def turn(index: int, blocks: int, output: int, think_s: float, name: str) -> Turn:
    return Turn(
        index=index,
        arrival_s=0.0,
        think_time_s=think_s,
        input_tokens=blocks * BLOCK,
        output_tokens=output,
        hash_ids=tuple(range(1, blocks + 1)),
        namespace=name,
        block_size=BLOCK,
    )


# a decodes long; b's first turn ends, c's prompt pushes b's blocks to the host tier, and b's
# second turn (its first turn, resent, plus 4 blocks) comes while a still decodes
WORKLOAD = [
    Conversation("a", "crafted", (turn(0, 8, 3000, 0.0, "a"),)),
    Conversation(
        "b",
        "crafted",
        (turn(0, PREFIX_BLOCKS, 4, 0.0, "b"), turn(1, PREFIX_BLOCKS + 4, 4, 3.0, "b")),
    ),
    Conversation("c", "crafted", (turn(0, 100, 4, 0.0, "c"),)),
]


async def replay(
    pages_per_step: int,
    per_page_ms: float = PER_PAGE_MS,
    disk: bool = False,
    step_log: str = "",
    piece_ms: float = 0.0,
):
    fleet = {
        "ranks": "1",
        "slots": "2",
        "block_size": str(BLOCK),
        "gpu_pages": "120",
        "host_pages": "0" if disk else "400",
        "disk_pages": "400" if disk else "0",
        "retained_conversations": "0",
        "onboard_pages_per_step": str(pages_per_step),
        "step_log": step_log,
    }
    config = load_sim_config(None, fleet)
    figure = "admit_ms_per_disk_page" if disk else "admit_ms_per_host_page"
    hardware = dataclasses.replace(
        config.hardware, **{figure: per_page_ms, "piece_ms_per_host_page": piece_ms}
    )
    target = SimTarget(dataclasses.replace(config, hardware=hardware))
    try:
        options = DriverOptions(sessions=3, time_scale=1.0, stagger_s=0.5)
        result = await run_arm("sim", target, WORKLOAD, TokenSynthesizer(1, 32000), options, {})
        (rank,) = target.fleet.ranks.values()
        return {(r.conversation_id, r.turn_index): r for r in result.records}, rank
    finally:
        await target.aclose()


def host_pages_onboarded(rank) -> int:
    return rank.manager.tiers.metrics["host"].pages_out


def longest_wait(record, joining) -> float:
    """`record`'s longest wait between two tokens while `joining` waited for its first."""
    window = [t for t in record.token_times_s if joining.arrival_s <= t]
    window = window[: next(i for i, t in enumerate(window) if t > joining.first_token_s) + 1]
    return max(b - a for a, b in itertools.pairwise(window))


async def test_a_host_prefix_comes_up_a_piece_a_step_while_another_sequence_decodes() -> None:
    """If this fails, the simulator admits a request with a long host prefix in one pause of
    the whole batch (or not at all before its pieces), where the engine brings up
    `onboard_pages_per_step` pages a step while the running sequences step between pieces:
    with 8 pages a piece, b's 40 host pages come up in 4 pieces and the 8 left at its
    admission, so a's longest wait is one piece's 80 ms, not the 400 ms of one admission."""
    at_once, at_once_rank = await replay(pages_per_step=0)
    pieces, rank = await replay(pages_per_step=8)
    b_at_once, b_pieces = at_once[("b", 1)], pieces[("b", 1)]
    assert b_at_once.reused_tokens == b_pieces.reused_tokens == PREFIX_BLOCKS * BLOCK
    onboarded = host_pages_onboarded(rank)
    assert onboarded == host_pages_onboarded(at_once_rank) >= 32  # c pushed b's prefix out
    assert at_once_rank.onboard_ahead.pieces == 0
    assert rank.onboard_ahead.pieces == -(-onboarded // 8) - 1  # the last 8 at the admission
    piece_s = 8 * PER_PAGE_MS / 1e3
    a_at_once, a_pieces = at_once[("a", 0)], pieces[("a", 0)]
    assert a_pieces.token_times_s[-1] > b_pieces.first_token_s  # b joined while a decoded
    assert longest_wait(a_at_once, b_at_once) >= onboarded * PER_PAGE_MS / 1e3
    assert piece_s <= longest_wait(a_pieces, b_pieces) < 2 * piece_s
    # the pieces' pauses and the admission's add up to one admission's (nothing twice)
    assert rank.busy_s - at_once_rank.busy_s == pytest.approx(0.0, abs=0.05)
    # b joins four steps later than in one go (the steps between pieces)
    assert b_pieces.first_token_s > b_at_once.first_token_s


async def test_a_disk_page_costs_its_read_on_the_core_thread_and_crosses_the_host_link() -> None:
    """If this fails, a page read from the disk tier is priced as a copy at the disk's rate
    inside the step where the engine reads and checks its file on the core thread before the
    step (`admit_ms_per_disk_page`): with the figure set, b's disk prefix holds a's decode for
    its pieces as host pages do, and the step's copy of a disk page is the host link's."""
    pieces, rank = await replay(pages_per_step=8, disk=True)
    assert pieces[("b", 1)].reused_tokens == PREFIX_BLOCKS * BLOCK
    assert rank.onboard_ahead.pieces >= 3
    assert longest_wait(pieces[("a", 0)], pieces[("b", 1)]) >= 8 * PER_PAGE_MS / 1e3
    config = load_sim_config()
    read = dataclasses.replace(config.hardware, admit_ms_per_disk_page=1.0)
    costs = CostModel.from_figures(config.model, read, BLOCK)
    plain = CostModel.from_figures(config.model, config.hardware, BLOCK)
    assert costs.disk_copy_s_per_page == costs.host_copy_s_per_page
    assert plain.disk_copy_s_per_page > plain.host_copy_s_per_page
    assert admission_seconds(read, 0, 0, 3) == pytest.approx(0.003)


async def test_without_a_per_page_figure_the_request_joins_at_once() -> None:
    """If this fails, pieces that cost nothing still hold a request back (the packaged
    figures have none): the simulator's admissions stay as before it modelled pieces."""
    free, rank = await replay(pages_per_step=8, per_page_ms=0.0)
    at_once, _ = await replay(pages_per_step=0, per_page_ms=0.0)
    assert rank.onboard_ahead.pieces == 0
    assert free[("b", 1)].first_token_s == pytest.approx(at_once[("b", 1)].first_token_s)


def test_a_plan_is_read_once_and_ends_when_the_rest_fits_one_piece() -> None:
    """If this fails, the simulator's pieces are not the engine's: a plan is the match's
    lower block positions read once, at the first piece; each piece holds the prompt up to the
    block after its last position; when what is left fits one piece the plan ends and the
    admission brings the rest up (a later admission short of room plans again from what is
    still below the device)."""
    hardware = dataclasses.replace(load_sim_config().hardware, admit_ms_per_host_page=1.0)
    ahead = OnboardAhead(pages_per_step=2, hardware=hardware)
    where = ("device", "host", "host", "disk", "host", "disk", "")
    match = PrefixMatch(7, 7, {"full": (0,) * 7}, {"full": where})
    calls = []

    def match_of():
        calls.append(1)
        return match

    assert [ahead.next_piece_blocks("r", match_of, True) for _ in range(3)] == [3, 5, None]
    assert len(calls) == 1
    assert ahead.next_piece_blocks("r", match_of, True) == 3 and len(calls) == 2  # planned anew
    ahead.brought("r", 0)  # a piece that brought nothing up ends the plan
    assert ahead.next_piece_blocks("r", match_of, True) == 3 and len(calls) == 3
    assert ahead.next_piece_blocks("r", match_of, False) is None  # nothing else runs: at once
    free = OnboardAhead(pages_per_step=2, hardware=load_sim_config().hardware)
    assert free.next_piece_blocks("r", match_of, True) is None  # no figure: at once


async def test_each_piece_brings_its_pages_up_in_its_own_step_and_holds_them(tmp_path) -> None:
    """If this fails, the simulator's pieces move no page until the admission, where the
    engine's piece is a prefix hold that takes device pages a step at a time (making room as an
    admission does): the step log shows b's 40 host pages coming up 8 a step, four pieces and
    the admission's last 8, not all at once."""
    records, rank = await replay(pages_per_step=8, step_log=str(tmp_path))
    assert records[("b", 1)].reused_tokens == PREFIX_BLOCKS * BLOCK
    lines = [json.loads(line) for line in (tmp_path / "steps-rank-0.jsonl").open()]
    onboarded = [line["host_in"] for line in lines if line["host_in"]]
    assert sum(onboarded) == host_pages_onboarded(rank) and max(onboarded) == 8
    assert len(onboarded) == rank.onboard_ahead.pieces + 1 == -(-sum(onboarded) // 8)
    assert not rank.holds  # the admission took the last piece's hold over
    # and each piece's kvstore request ended when the next took its pages over
    assert not [key for key in rank.manager.request_ids() if key.startswith("ahead-")]
    rank.manager.check_integrity()


async def test_a_piece_pauses_the_rank_at_the_piece_figure_and_the_admission_at_its_own():
    """If this fails, `hardware.piece_ms_per_host_page` is ignored (every piece priced at the
    admission's figure, as before the fleet's logs priced them apart) or prices the admission
    too: a's waits while b came up are b's 4 pieces at 8 x 2.5 ms and its admission's 8 pages
    at 8 x 10 ms."""
    pieces, rank = await replay(pages_per_step=8, piece_ms=PER_PAGE_MS / 4)
    assert rank.onboard_ahead.pieces == 4
    a, b = pieces[("a", 0)], pieces[("b", 1)]
    window = [t for t in a.token_times_s if b.arrival_s <= t <= b.first_token_s + 1.0]
    waits = sorted(later - earlier for earlier, later in itertools.pairwise(window))
    piece_s, admission_s = 8 * PER_PAGE_MS / 4 / 1e3, 8 * PER_PAGE_MS / 1e3
    assert waits[-1] >= admission_s
    assert all(piece_s <= wait < 2 * piece_s for wait in waits[-5:-1])


async def test_a_model_with_a_window_layer_is_admitted_at_once() -> None:
    """If this fails, the simulator brings a hybrid model's prefix up in pieces, where the
    engine's piece (a prefix hold) resumes nowhere mid-prompt on a window or state life cycle
    and the admission onboards everything at once."""
    config = load_sim_config(HYBRID, {"ranks": "1", "onboard_pages_per_step": "8"})
    hardware = dataclasses.replace(config.hardware, admit_ms_per_host_page=PER_PAGE_MS)
    target = SimTarget(dataclasses.replace(config, hardware=hardware))
    try:
        (rank,) = target.fleet.ranks.values()
        assert rank.onboard_ahead.pages_per_step == 0
    finally:
        await target.aclose()
    full = SimTarget(dataclasses.replace(load_sim_config(None, {"ranks": "1"}), hardware=hardware))
    try:
        (rank,) = full.fleet.ranks.values()
        assert rank.onboard_ahead.pages_per_step == 256
    finally:
        await full.aclose()
