"""bench/step_mix.py: a fleet's steps read back into replays, requests and slot-to-start gaps."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # step_mix imports step_costs as the bench scripts do
spec = importlib.util.spec_from_file_location("step_mix", BENCH / "step_mix.py")
step_mix = importlib.util.module_from_spec(spec)
sys.modules["step_mix"] = step_mix  # its dataclasses look their module up
spec.loader.exec_module(step_mix)


def step(t: float, s: float, prefill=(), decode=()) -> dict:
    return {"t": t, "s": s, "prefill": [list(p) for p in prefill], "decode": list(decode),
            "host_in": 0, "disk_in": 0}  # fmt: skip


def test_the_warm_up_is_left_out_and_a_long_idle_starts_another_replay() -> None:
    """If this fails, the fleet's warm-up prompts count as replay work, or two arms appended
    to one log read as one replay with a gap of minutes."""
    steps = [step(0.0, 12.0, prefill=((0, 4000),)), step(12.0, 0.01, decode=(4001,)),
             step(13.0, 0.05, prefill=((3984, 4000),)), step(14.0, 0.01, decode=(4001,)),
             step(20.0, 0.04, prefill=((0, 8192),)), step(20.1, 0.01, decode=(8193,)),
             step(500.0, 0.04, prefill=((0, 8192),))]  # fmt: skip
    replays = step_mix.split_replays(steps)
    assert [[s["t"] for s in replay] for replay in replays] == [[20.0, 20.1], [500.0]]


def test_a_replay_a_later_log_holds_again_is_counted_once(tmp_path) -> None:
    """If this fails, the per-page fits and pause counts over several draws count a draw again
    for every later folder whose log holds it too (an engine appends to its step log: a draw
    run on the same machine after another copies both), as the H100 disk-tier logs did; two
    runs that only start alike are both kept."""

    def write(folder: str, steps: list[dict]) -> Path:
        path = tmp_path / folder / "steps-engine0.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps(one) + "\n" for one in steps))
        return path.parent

    first = [step(20.0, 0.04, prefill=((0, 8192),)), step(20.1, 0.01, decode=(8193,))]
    second = [step(900.0, 0.04, prefill=((0, 8192),)), step(900.1, 0.01, decode=(8193,))]
    alike = [step(20.0, 0.04, prefill=((0, 8192),)), step(20.2, 0.01, decode=(8193,))]
    folders = [write("draw1", first), write("draw2", first + second), write("sim", alike)]
    replays = step_mix.every_replay(folders)
    assert [[one["t"] for one in replay] for replay in replays] == [
        [20.0, 20.1],
        [900.0, 900.1],
        [20.0, 20.2],
    ]


def test_a_freed_slot_is_timed_to_the_next_new_request() -> None:
    """If this fails, the slot-to-start gaps (what `hardware.dispatch_ms` is read from) count a
    request's own next chunk or decode as a new request, or miss the slot its end freed."""
    steps = [step(0.0, 0.1, prefill=((0, 100),)),  # fills slot 1
             step(0.1, 0.1, prefill=((0, 200),), decode=(101,)),  # fills slot 2
             step(0.2, 0.1, prefill=((200, 300),), decode=(102,)),  # its next chunk: no start
             step(0.3, 0.1, decode=(103, 301)),
             step(0.4, 0.1, decode=(302,)),  # 103 ended at 0.4: a slot is free
             step(0.55, 0.1, prefill=((96, 500),), decode=(303,))]  # fmt: skip
    starts = step_mix.slot_starts(steps)
    assert [(round(gap, 6), end) for gap, end in starts] == [(0.15, 500)]


def test_an_admission_while_decoding_splits_into_the_path_and_the_pause() -> None:
    """If this fails, the admission figures (`hardware.dispatch_ms`, `admit_ms`,
    `admit_ms_per_host_page`) are read from the wrong stretch: the path runs from the end of
    the step where the other request last decoded to the rank's last step before the admitting
    one; the pause, from that step's end to the admitting step's start."""
    admitting = step(0.50, 0.3, prefill=((96, 500),), decode=(303,))
    admitting["host_in"] = 40
    steps = [step(0.0, 0.1, prefill=((0, 300),)),
             step(0.1, 0.01, decode=(100, 301)),  # the other request's last decode
             step(0.12, 0.01, decode=(302,)),
             step(0.14, 0.01, decode=(303,)),  # the rank's last step before the pause
             admitting,
             step(0.8, 0.01, decode=(304, 501))]  # fmt: skip
    rows = step_mix.admissions_while_decoding(steps)
    assert [(round(pause, 6), round(path, 6), host, disk) for pause, path, host, disk in rows] == [
        (0.35, 0.04, 40, 0)
    ]


def test_a_piece_brought_up_ahead_is_the_pause_before_a_decode_step_with_pages() -> None:
    """If this fails, the pieces' per-page figures (`admit_ms_per_host_page`,
    `admit_ms_per_disk_page`) are read from the wrong steps: a piece is a step that decodes,
    starts no new request and onboarded pages, after a decode step; its pause runs from that
    step's end. A new request's admission, or a decode with nothing onboarded, is no piece."""
    pieces = [step(0.30, 0.01, decode=(302,)), step(0.50, 0.01, decode=(303,))]
    pieces[0]["host_in"], pieces[1]["host_in"], pieces[1]["disk_in"] = 256, 200, 56
    admitting = step(0.60, 0.3, prefill=((96, 500),), decode=(305,))
    admitting["host_in"] = 10
    steps = [step(0.0, 0.1, prefill=((0, 300),)),
             step(0.1, 0.01, decode=(301,)),
             pieces[0], pieces[1],
             step(0.55, 0.01, decode=(304,)),  # nothing onboarded: no piece
             admitting,
             step(0.95, 0.01, decode=(306, 501))]  # fmt: skip
    pieces[1]["disk_out"] = 30
    rows = step_mix.pieces_while_decoding(steps)
    assert [(round(pause, 6), host, disk, out) for pause, host, disk, out in rows] == [
        (0.19, 256, 0, 0),
        (0.19, 200, 56, 30),
    ]
    work = ((256, 0, 0), (100, 50, 10), (10, 200, 0), (50, 0, 120))
    fit = step_mix.per_page_fit(
        [(0.002 + 0.0002 * h + 0.001 * d + 0.0007 * w, h, d, w) for h, d, w in work]
    )
    assert fit == pytest.approx((0.002, 0.0002, 0.001, 0.0007))


def test_a_steady_decode_is_classed_by_what_else_ran_on_the_chip() -> None:
    """If this fails, bench/decode_sharing.py compares unlike decode steps: a decode step of
    one rank is solo only when no other rank's step covers 5 % of its cycle, with prefill when
    an overlapping step computes a chunk, and a decode followed by a prefill (no cycle between
    two tokens) or by an idle gap is left out."""
    spec = importlib.util.spec_from_file_location("decode_sharing", BENCH / "decode_sharing.py")
    decode_sharing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decode_sharing)
    rank0 = [step(0.0, 0.01, decode=(100, 200)), step(0.01, 0.01, decode=(101, 201)),
             step(0.02, 0.01, decode=(102, 202)), step(0.03, 0.01, decode=(103, 203)),
             step(0.04, 0.01, decode=(104,)), step(0.2, 0.01, decode=(105,)),
             step(0.21, 0.1, prefill=((0, 50),))]  # fmt: skip
    rank1 = [step(0.0105, 0.0002, decode=(5,)),  # 2 % of rank 0's second cycle: still solo
             step(0.02, 0.005, decode=(6,)), step(0.03, 0.005, prefill=((0, 9),))]  # fmt: skip
    rows = decode_sharing.steady_decodes([rank0, rank1])
    kinds = [(batch, kind, round(cycle, 4), context) for batch, kind, cycle, context in rows]
    assert kinds[:4] == [(2, "solo", 0.01, 300), (2, "solo", 0.01, 302),
                         (2, "with decode", 0.01, 304), (2, "with prefill", 0.01, 306)]  # fmt: skip
    # rank 0's step at 0.04 idles 150 ms before its next and the one at 0.2 is followed by a
    # prefill: left out; rank 1's first decode runs beside rank 0's
    assert kinds[4:] == [(1, "with decode", 0.0095, 5)]


def test_a_gap_between_tokens_is_classed_by_what_held_its_step() -> None:
    """If this fails, bench/decode_gaps.py blames the wrong thing for the tail of the gaps
    between tokens: a gap is step start to step start, one per sequence the second step
    decodes; a chunk of prefill in the second step classes it first, then a pause over 5 ms
    before it (a piece when pages came up, else a plain pause), then a first step over 15 ms;
    the quantiles weigh each gap by its tokens."""
    spec = importlib.util.spec_from_file_location("decode_gaps", BENCH / "decode_gaps.py")
    decode_gaps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decode_gaps)
    piece = step(0.05, 0.006, decode=(103, 203))
    piece["host_in"] = 256
    steps = [step(0.0, 0.006, decode=(100, 200)),
             step(0.006, 0.006, decode=(101, 201)),  # decode
             step(0.012, 0.02, decode=(102, 202)),  # decode (its own length comes next)
             piece,  # after the long step and an 18 ms pause with pages: a piece
             step(0.066, 0.006, decode=(104, 204)),  # 10 ms pause, nothing onboarded: pause
             step(0.08, 0.2, prefill=((0, 4096),), decode=(105, 205)),  # prefill, paused too
             step(0.28, 0.006, decode=(106,)),  # after a 200 ms step: long step
             step(0.5, 0.1, prefill=((0, 64),))]  # fmt: skip
    gaps = decode_gaps.decode_gaps(steps)
    assert [(round(gap, 3), tokens, kind) for gap, tokens, kind in gaps] == [
        (0.006, 2, "decode"), (0.006, 2, "decode"), (0.038, 2, "piece"), (0.016, 2, "pause"),
        (0.014, 2, "prefill"), (0.2, 1, "long step"),
    ]  # fmt: skip
    row = decode_gaps.gaps_row(gaps)
    assert (row["p50"], row["p90"]) == (pytest.approx(0.014), pytest.approx(0.038))
    assert row["classes"]["piece"] == pytest.approx((2 / 11, 0.038, 2 / 3))
    assert row["classes"]["long step"][2] == pytest.approx(1 / 3)
    # the pauses beside the plain decodes: the first step's seconds, the second's log fields
    steps[4].update(ahead=False, waiting=1, plan=0.008)
    steps[2].update(ahead=True, waiting=1)
    steps[1].update(ahead=True, waiting=0)
    origins = decode_gaps.pause_origins(steps)
    assert origins == {
        "pause": [(0.006, False, 1, 0.008)],
        "decode": [(0.006, True, 0, None), (0.006, True, 1, None)],
    }
    assert decode_gaps.origins_row(origins) == [
        "1 / 6.00 / 8.00 / 0% / 100%",
        "2 / 6.00 / - / 100% / 50%",
    ]
