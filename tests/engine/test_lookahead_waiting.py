"""Requests waiting at the rank do not stop the overlapped decode: the next step is planned
while the one before runs, admissions included, and the outputs are those of a core that reads
every step's tokens before planning the next."""

from __future__ import annotations

import dataclasses
import json

from engine_testkit import TEST_CONFIG, greedy, random_prompt, serve_stepped
from kvfleet.services.engine.config.model_config import PRESETS
from kvfleet.services.engine.core import engine_core
from kvfleet.services.engine.core.lookahead import PENDING, can_look_ahead, mark_pending, settle
from kvfleet.services.engine.request.engine_request import GenerateCall
from kvfleet.services.engine.request.scheduled_chunk import ScheduledChunk
from test_onboard_ahead import CONFIG as PIECES
from test_onboard_ahead import second_turn, tiny_full_attention

AHEAD = TEST_CONFIG.with_changes(decode_graphs="static", overlap_decode=True)
EAGER = TEST_CONFIG.with_changes(decode_graphs="off")


def test_a_full_batch_with_a_queue_still_plans_each_step_ahead():
    """If this fails, a rank with requests queued behind a full batch reads every step's tokens
    before it plans the next (each decode step's host work after its chip time), or planning
    ahead changed what a request gets."""
    lengths = [14, 6, 21, 9, 12]
    arrivals = [
        (0, GenerateCall(f"q{c}", random_prompt(c, 20 + 9 * c), greedy(n), f"q{c}"))
        for c, n in enumerate(lengths)
    ]
    two_slots = {"max_batch_size": 2}
    ahead = serve_stepped(AHEAD.with_changes(**two_slots), "ahead-queue", arrivals)
    eager = serve_stepped(EAGER.with_changes(**two_slots), "ahead-queue-eager", arrivals)
    assert ahead.outputs == eager.outputs
    assert sum(1 for fed, waiting, _ in ahead.steps if fed and waiting) >= 10


def test_a_prefill_short_of_pages_leaves_the_decode_planned_ahead():
    """If this fails, a rank whose newest request's prefill waits for pages (160 here, the
    decoding one holds 63 and more) reads every step's tokens before it plans the next, or
    planning ahead changed what either request gets (the prefill is preempted and resumes as
    the tokens-first core does it)."""
    arrivals = [
        (0, GenerateCall("long", random_prompt(1, 1000), greedy(300), "long")),
        (40, GenerateCall("late", random_prompt(2, 1600), greedy(8), "late")),
    ]
    ahead = serve_stepped(AHEAD, "ahead-stall", arrivals)
    eager = serve_stepped(EAGER, "ahead-stall-eager", arrivals)
    assert ahead.outputs == eager.outputs
    stalled = [fed for fed, _, left_out in ahead.steps if left_out]
    # (measured: 103 of 109 planned ahead; the rest follow a preemption or a page boundary
    # with no page free)
    assert len(stalled) > 50 and stalled.count(False) <= 10


def test_settle_fills_pending_inputs_and_drops_ended_sequences():
    class Seq:
        def __init__(self, output, finished=False):
            self.prompt, self.output, self.finished = (7, 8), output, finished

        def tokens(self, start, stop):
            return [*self.prompt, *self.output][start:stop]

    running, ended, admitted = Seq([3, PENDING]), Seq([4, PENDING], finished=True), Seq([])
    chunks = [
        ScheduledChunk.one_token(running, 3, PENDING, {}),
        ScheduledChunk.one_token(ended, 3, PENDING, {}),
        ScheduledChunk(admitted, 0, (7, 8), {}),
    ]
    running.output[1] = 5  # the step in flight's token, read
    settled = settle(chunks)
    assert [(c.sequence, c.start, c.new_tokens) for c in settled] == [
        (running, 3, (5,)),
        (admitted, 0, (7, 8)),
    ]


def test_an_admission_planned_ahead_reads_the_tokens_first(monkeypatch):
    """If this fails, a request admitted in a step planned while the one before runs (here the
    admission after the last piece of a host prefix came up) launched its prefill with device
    inputs, or with the plan's placeholder tokens: its output differs from the one an
    all-at-once admission without overlap gives."""
    monkeypatch.setitem(PRESETS, "tiny-full-attention", tiny_full_attention)
    settled = []

    def counted(chunks):
        settled.append(sorted(c.sequence.call.request_id for c in chunks))
        return settle(chunks)

    monkeypatch.setattr(engine_core, "settle", counted)
    config = dataclasses.replace(PIECES, decode_graphs="static", overlap_decode=True)
    b_tokens, a_tokens, _ = second_turn(config, "ahead-pieces")
    plain = dataclasses.replace(PIECES, decode_graphs="off", onboard_pages_per_step=0)
    b_plain, _, _ = second_turn(plain, "ahead-pieces-plain")
    assert b_tokens == b_plain
    assert len(a_tokens) == 300
    assert ["a", "b2"] in settled  # B's admission was planned ahead, beside A's decode


def test_a_sequence_out_of_the_step_in_flight_plans_ahead_only_behind_those_in_it():
    """If this fails, a step is planned ahead where making room for an older sequence that is
    not in flight (a prefill short of pages) may preempt one whose token is still on the
    device: the preempted sequence would be re-queued with a placeholder token."""

    class Seq:
        def __init__(self, key):
            self.key, self.output, self.finished = key, [], False
            self.sampling, self.num_tokens = greedy(10), 4

    class Pool:
        def num_available(self):
            return 8

    flying, stalled = Seq("flying"), Seq("stalled")
    inflight = mark_pending([ScheduledChunk.one_token(flying, 3, 5, {})], lambda: [7])
    manager = type("Manager", (), {"pools": {"full": Pool()}})()

    def ahead(*running):
        scheduler = type("Scheduler", (), {"running": list(running)})()
        return can_look_ahead(inflight, scheduler, manager, commands_waiting=False)

    assert ahead(flying) and ahead(flying, stalled)
    assert not ahead(stalled, flying)
    assert not ahead(stalled)  # the sequence in flight is gone (only a command does that)


def test_the_step_log_says_which_steps_were_planned_ahead_and_who_waited(tmp_path):
    """If this fails, a rank's step log no longer tells a pause between steps that had no plan
    made ahead (the step before's tokens read first) from one that had, or how many requests
    were waiting then: what docs/sim-vs-live.md reads the gaps between tokens by."""
    path = tmp_path / "steps.jsonl"
    config = AHEAD.with_changes(max_batch_size=2, step_log_path=str(path))
    arrivals = [
        (0, GenerateCall(f"w{c}", random_prompt(c, 30), greedy(6), f"w{c}")) for c in range(3)
    ]
    serve_stepped(config, "ahead-step-log", arrivals)
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    first = steps[0]
    assert (len(first["prefill"]), first["waiting"], first["ahead"]) == (2, 1, False)
    queued_decodes = [s for s in steps if len(s["decode"]) == 2 and s["waiting"] == 1]
    # the first decode step follows the prefill (nothing in flight); the others are planned ahead
    assert [s["ahead"] for s in queued_decodes] == [False] + [True] * (len(queued_decodes) - 1)
    assert len(queued_decodes) >= 3
    assert steps[-1]["waiting"] == 0
