"""A request whose host prefix would come up in pieces waits while the decoding sequence beside
it leaves no room for one. The rank asks it every step; asking must not walk its prefix again
each time (on the H100 fleet that walk, with a new piece request planned each step, was a
12-14 ms pause between decode steps), and the piece request kept meanwhile must be forgotten
when the request joins, so the outputs are those of an engine without pieces."""

from __future__ import annotations

import dataclasses
import random

from engine_testkit import greedy, shared_compute
from kvfleet.kvstore import manager as manager_module
from kvfleet.services.engine.config.model_config import PRESETS
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.request.engine_request import GenerateCall
from test_onboard_ahead import CONFIG, outputs_of, run_to_end, tiny_full_attention

A_DECODES = 40


def waiting_turn(config, storage: str, walks: list[int]):
    """B's turn 1 ends; A (45 of the 48 pages) pushes it to host and decodes; B's turn 2 waits
    beside A. Returns (B's turn-2 tokens, A's tokens, prefix walks per step while B waited,
    requests the manager still tracks at the end)."""
    core = EngineCore(config, compute=shared_compute(config, storage))
    rng = random.Random(11)
    try:
        b_prompt = tuple(rng.randrange(256) for _ in range(480))
        b_output = run_to_end(core, core.submit(GenerateCall("b1", b_prompt, greedy(4), "b")))
        a_prompt = tuple(rng.randrange(256) for _ in range(712))
        a = core.submit(GenerateCall("a", a_prompt, greedy(A_DECODES), "a"))
        a_tokens: list[int] = []
        while "a" not in core._sequences or not core._sequences["a"][0].context_done:
            core.run_once()
            a_tokens += outputs_of(a)
        b2_prompt = (*b_prompt, *b_output, *(rng.randrange(256) for _ in range(20)))
        b2 = core.submit(GenerateCall("b2", b2_prompt, greedy(8), "b"))
        core.run_once()  # B's turn 2 joins the queue
        per_step = []
        while "a" in core._handles:
            before = len(walks)
            core.run_once()
            a_tokens += outputs_of(a)
            per_step.append(len(walks) - before)
            assert not core._sequences["b2"][0].admitted, "B found room beside A"
        b_tokens = run_to_end(core, b2)
        core.manager.check_integrity()
        return b_tokens, a_tokens, per_step, list(core.manager.request_ids())
    finally:
        core.stop()


def test_a_request_waiting_for_room_does_not_walk_its_prefix_each_step(monkeypatch):
    """If this fails, every step of a rank with a turn waiting for room plans that turn's next
    piece again (a new request, its prefix walked through every tier), or the request kept
    for a piece outlives its plan (its prefix stays tracked after the turn joined)."""
    monkeypatch.setitem(PRESETS, "tiny-full-attention", tiny_full_attention)
    walks: list[int] = []
    walk = manager_module.match_prompt

    def counted(*args, **kwargs):
        walks.append(1)
        return walk(*args, **kwargs)

    monkeypatch.setattr(manager_module, "match_prompt", counted)
    b_tokens, a_tokens, per_step, left = waiting_turn(CONFIG, "ahead-no-room", walks)
    assert len(per_step) >= A_DECODES - 2
    # the index changes when A fills a page (every 16 tokens): walks then, not every step
    assert sum(per_step) <= len(per_step) // 4, per_step
    assert left == []
    at_once = dataclasses.replace(CONFIG, onboard_pages_per_step=0)
    b_once, a_once, _, _ = waiting_turn(at_once, "ahead-no-room-off", [])
    assert (b_tokens, a_tokens) == (b_once, a_once)
