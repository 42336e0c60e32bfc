"""What steps a fleet ran, against what steps the simulator ran for the same replay.

Reads step logs, the engine's (`kvfleet engine --step-log`, kept by the fleet replay as
`steps-engine<i>.jsonl[.xz]`) or the simulator's (`fleet.step_log`, `bench/fleet_sim.py
--step-logs`: `steps-rank-<i>.jsonl`), one folder per run, and prints per run the mix: prefill
chunks and tokens, decode steps and their mean batch, and how each rank's time splits into
steps, short gaps between steps (host work the step's seconds leave out) and idle gaps (the
rank had nothing to step). A folder whose ranks idle for over `REPLAY_GAP_S` holds several
replays (a device call's arms appended to one log): each is a run. The fleet's warm-up (each
rank's 4,000-then-2,000-token prompts, two at once, before the replay) is left out.

`--starts` prints instead how long a rank's freed slot took to start a new request, by the
request's prompt length: from the step that ended a request (its last decode) to the step
with the new request's first prefill chunk, the slot freed last matched to the next start.
Requests and slots are read from the steps (a request's chunks follow on, its decodes grow by
one a step; SLOTS per rank). The lower quartile per 16k tokens, fitted by a line, is what the
simulator's `hardware.dispatch_ms` and `dispatch_ms_per_ktoken` are (replay/sim_dispatch.py).

`--admissions` prints how the rank's timeline goes when a new request is admitted while another
sequence decodes: the seconds from the slot that freed (the step where the other request ended)
to the rank's last step before the admitting step, in which the rank keeps decoding (the path
to the rank: `hardware.dispatch_ms`), and the pause before the admitting step, in which it
runs no step (the engine's add and admission: `hardware.admit_ms`, and
`admit_ms_per_host_page` from the pauses with pages onboarded from the host tier).

With `--sim YAML` each step is also priced by the simulator's cost model (seconds alone on the
chip, host overhead included), so two runs' work compares apart from how it was timed.

Run: .venv/bin/python bench/step_mix.py FOLDER... [--sim YAML] [--json OUT] [--starts]
     [--admissions]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from kvfleet.services.core.cost_model import CostModel
from kvfleet.services.replay.sim_config import load_sim_config
from step_costs import IDLE_S, steps_of, work_of

REPLAY_GAP_S = 120.0  # a rank idle this long: the log's next steps are another replay
WARM_UP_ENDS = (4000, 6000)  # fleet_replay.py's warm-up prompts end there (two at once, or
WARM_UP_DECODES = (range(4000, 4017), range(6000, 6017))  # the second reusing the first)
SLOTS = 2  # requests a rank runs at once (the fleet replay's slots)
STARTS_BUCKET = 16_384  # prompt tokens per row of --starts


@dataclass
class Mix:
    """One replay's steps over all its ranks."""

    wall_s: float = 0.0  # first step's start to last step's end, any rank
    steps: int = 0
    prefill_chunks: int = 0  # prefill spans (one request's share of a step)
    prefill_tokens: int = 0
    prefill_from_zero: int = 0  # tokens of chunks that start at 0 (nothing reused, or recompute)
    mixed_steps: int = 0  # steps with both prefill and decode
    decode_steps: int = 0  # steps with a decode
    decode_tokens: int = 0
    step_s: float = 0.0  # sum of the steps' seconds
    short_gap_s: float = 0.0  # gaps under IDLE_S between a rank's step's end and its next
    idle_gaps: int = 0  # gaps of IDLE_S or more
    idle_s: float = 0.0
    idle_gap_p50_s: float = 0.0
    rank_span_s: float = 0.0  # sum over ranks of first start to last end
    model_prefill_s: float = 0.0  # the cost model's seconds of the steps with a prefill chunk
    model_decode_s: float = 0.0  # ... and of the decode-only steps (--sim)

    @property
    def mean_decode_batch(self) -> float:
        return self.decode_tokens / self.decode_steps if self.decode_steps else 0.0


def _warm_up(step: dict) -> bool:
    spans, decodes = step["prefill"], step["decode"]
    return (all(end in WARM_UP_ENDS for _, end in spans) and (bool(spans) or bool(decodes))
            and all(any(c in r for r in WARM_UP_DECODES) for c in decodes))  # fmt: skip


def split_replays(steps: list[dict]) -> list[list[dict]]:
    """One rank's steps cut where it idled over REPLAY_GAP_S, each less its leading warm-up."""
    replays: list[list[dict]] = []
    end = None
    for step in sorted(steps, key=lambda step: step["t"]):
        if end is None or step["t"] - end > REPLAY_GAP_S:
            replays.append([])
        end = step["t"] + step["s"]
        if replays[-1] or not _warm_up(step):
            replays[-1].append(step)
    return [replay for replay in replays if replay]


def mix_of(ranks: list[list[dict]], costs: CostModel | None = None) -> Mix:
    """The mix of one replay, from each rank's steps (in time order, warm-up left out);
    `costs` prices each step as the simulator would."""
    mix = Mix()
    idle = []
    for steps in ranks:
        for step, after in zip(steps, [*steps[1:], None], strict=True):
            mix.steps += 1
            mix.step_s += step["s"]
            spans = step["prefill"]
            if costs is not None:
                priced = costs.step_seconds(work_of(step))
                if spans:
                    mix.model_prefill_s += priced
                else:
                    mix.model_decode_s += priced
            mix.prefill_chunks += len(spans)
            mix.prefill_tokens += sum(b - a for a, b in spans)
            mix.prefill_from_zero += sum(b - a for a, b in spans if a == 0)
            if step["decode"]:
                mix.decode_steps += 1
                mix.decode_tokens += len(step["decode"])
                mix.mixed_steps += bool(spans)
            if after is not None:
                gap = max(0.0, after["t"] - step["t"] - step["s"])
                if gap < IDLE_S:
                    mix.short_gap_s += gap
                else:
                    idle.append(gap)
        if steps:
            mix.rank_span_s += steps[-1]["t"] + steps[-1]["s"] - steps[0]["t"]
    starts = [steps[0]["t"] for steps in ranks if steps]
    ends = [steps[-1]["t"] + steps[-1]["s"] for steps in ranks if steps]
    mix.wall_s = max(ends) - min(starts)
    mix.idle_gaps, mix.idle_s = len(idle), sum(idle)
    mix.idle_gap_p50_s = statistics.median(idle) if idle else 0.0
    return mix


def slot_starts(steps: list[dict]) -> list[tuple[float, int]]:
    """(seconds from the latest freed slot to a new request's first chunk, its prompt end) of
    one rank's replay. A decode context that does not grow on the next step ended a request;
    a prefill span that does not start where an open one ended is a new request (the engine
    logs a decode's context after its token, the simulator before: both continue a span)."""
    free = [steps[0]["t"]] * SLOTS
    open_ends: set[int] = set()
    decoding: set[int] = set()
    out = []
    previous_end = steps[0]["t"]
    for step in steps:
        decodes = set(step["decode"])
        free += [previous_end for c in decoding if c + 1 not in decodes]
        for start, end in step["prefill"]:
            if start in open_ends:
                open_ends.discard(start)
            elif free:
                freed = max(free)
                free.remove(freed)
                out.append((step["t"] - freed, end))
            open_ends.add(end)
        open_ends -= {c for c in decodes} | {c - 1 for c in decodes}
        decoding = decodes
        previous_end = step["t"] + step["s"]
    return out[SLOTS:]  # the first requests fill empty slots at the replay's start


def starts_table(folders: list[Path]) -> None:
    """Quantiles of the slot-to-start seconds per prompt length, and a line through the p25s."""
    buckets: dict[int, list[float]] = defaultdict(list)
    for seconds, prompt in rows_of_every_replay(folders, slot_starts):
        buckets[prompt // STARTS_BUCKET].append(seconds)
    print("| prompt tokens | starts | p10 ms | p25 ms | p50 ms |")
    print("|---|---|---|---|---|")
    xs, p25s = [], []
    for bucket, values in sorted(buckets.items()):
        q10, q25, q50 = np.percentile(values, [10, 25, 50])
        low = bucket * STARTS_BUCKET // 1024
        print(f"| {low}-{low + STARTS_BUCKET // 1024}k | {len(values)} | {1e3 * q10:.0f} | "
              f"{1e3 * q25:.0f} | {1e3 * q50:.0f} |")  # fmt: skip
        xs.append((bucket + 0.5) * STARTS_BUCKET)
        p25s.append(q25)
    slope, fixed = np.polyfit(xs, p25s, 1)
    print(f"p25 line: {1e3 * fixed:.1f} ms + {1e6 * slope:.3f} ms per 1,000 prompt tokens")


def admissions_while_decoding(
    steps: list[dict],
) -> list[tuple[float, float | None, int, int]]:
    """(pause, path, host pages, disk pages) of each step of one rank's replay that starts one new
    request's first chunk while another sequence decodes: the pause is from the previous step's
    end to its start; the path, from the end of the step where a second sequence last decoded
    (its slot freed) to the previous step's end, when only one sequence decoded in between
    (None otherwise); host and disk pages, the step's pages onboarded from those tiers."""
    out: list[tuple[float, float | None, int, int]] = []
    open_ends: set[int] = set()
    for i, step in enumerate(steps):
        new = [span for span in step["prefill"] if span[0] not in open_ends]
        open_ends |= {end for _, end in step["prefill"]}
        previous = steps[i - 1] if i else None
        if len(new) != 1 or not step["decode"] or previous is None:
            continue
        if previous["prefill"] or not previous["decode"]:
            continue
        previous_end = previous["t"] + previous["s"]
        j = i - 1
        while j >= 0 and not steps[j]["prefill"] and len(steps[j]["decode"]) == 1:
            j -= 1
        freed = steps[j] if j < i - 1 and j >= 0 else None
        path = None
        if freed is not None and not freed["prefill"] and len(freed["decode"]) == 2:
            path = previous_end - freed["t"] - freed["s"]
        out.append((step["t"] - previous_end, path, step["host_in"], step["disk_in"]))
    return out


def pieces_while_decoding(steps: list[dict]) -> list[tuple[float, int, int, int]]:
    """(pause, host pages, disk pages, pages written to disk) of each step of one rank's replay
    that follows a decode step, starts no new request, decodes, and onboarded pages since the
    step before: a piece of a waiting request's host/disk prefix brought up ahead of its
    admission (the engine's `onboard_pages_per_step`), read and copied on the core thread in
    the pause before it, with the disk writes of the evictions it made (0 where the log does
    not count them: logs before `disk_out`)."""
    out: list[tuple[float, int, int, int]] = []
    open_ends: set[int] = set()
    for i, step in enumerate(steps):
        new = [span for span in step["prefill"] if span[0] not in open_ends]
        open_ends |= {end for _, end in step["prefill"]}
        previous = steps[i - 1] if i else None
        if new or not step["decode"] or previous is None or previous["prefill"]:
            continue
        if not previous["decode"] or not (step["host_in"] or step["disk_in"]):
            continue
        pause = step["t"] - previous["t"] - previous["s"]
        out.append((pause, step["host_in"], step["disk_in"], step.get("disk_out", 0)))
    return out


def per_page_fit(rows: list[tuple[float, int, int, int]]) -> tuple[float, float, float, float]:
    """Least squares of pause = fixed + host pages x a + disk pages read x b + pages written
    x c: (fixed, a, b, c) in s (c is 0 when no row counts writes)."""
    design = np.array([[1.0, host, disk, out] for _, host, disk, out in rows])
    pauses = np.array([row[0] for row in rows])
    (fixed, host_s, disk_s, write_s), *_ = np.linalg.lstsq(design, pauses, rcond=None)
    return float(fixed), float(host_s), float(disk_s), float(write_s)


def every_replay(folders: list[Path]) -> list[list[dict]]:
    """Every replay of every rank log in the folders, each once: an engine appends to its step
    log, so a folder copied after a later draw on the same machine holds the earlier draws'
    replays again, step for step."""
    replays, seen = [], set()
    for folder in folders:
        for log in sorted(folder.glob("steps-*.jsonl*")):
            for replay in split_replays(steps_of(log)):
                key = tuple((step["t"], step["s"]) for step in replay)
                if key not in seen:
                    seen.add(key)
                    replays.append(replay)
    return replays


def rows_of_every_replay(folders: list[Path], rows_of) -> list:
    """`rows_of(replay)` over every replay of the folders (`every_replay`)."""
    return [row for replay in every_replay(folders) for row in rows_of(replay)]


def pieces_table(folders: list[Path]) -> None:
    """The pauses of the pieces brought up ahead of admissions, over every log."""
    rows = rows_of_every_replay(folders, pieces_while_decoding)
    if not rows:
        print("pieces brought up ahead of admissions while others decode: none")
        return
    q50, q90 = np.percentile([row[0] for row in rows], [50, 90])
    host, disk, out = (sum(r[i] for r in rows) for i in (1, 2, 3))
    print(f"pieces brought up ahead of admissions while others decode: {len(rows)} "
          f"({host:,} host pages, {disk:,} disk pages read, {out:,} written), pause p50/p90 "
          f"{1e3 * q50:.0f}/{1e3 * q90:.0f} ms")  # fmt: skip
    if len(rows) >= 4:
        fixed, host_s, disk_s, write_s = per_page_fit(rows)
        print(f"pieces' pause fit: {1e3 * fixed:.1f} ms + {1e3 * host_s:.3f} ms per host page"
              f" + {1e3 * disk_s:.3f} ms per disk page read"
              f" + {1e3 * write_s:.3f} ms per page written")  # fmt: skip


def admissions_table(folders: list[Path]) -> None:
    """The path and the pause of admissions while another sequence decodes, over every log."""
    rows = rows_of_every_replay(folders, admissions_while_decoding)
    paths = [path for _, path, _, _ in rows if path is not None]
    cold = [pause for pause, _, host, disk in rows if host == disk == 0]
    onboarded = [(pause, host) for pause, _, host, disk in rows if host > 0 and disk == 0]
    from_disk = [(pause, host, disk) for pause, _, host, disk in rows if disk > 0]
    print(f"admissions while another sequence decodes: {len(rows)}")
    if paths:
        q25, q50, q75 = np.percentile(paths, [25, 50, 75])
        print(f"path (freed slot to the last step before): {len(paths)}, p25/p50/p75 "
              f"{1e3 * q25:.0f}/{1e3 * q50:.0f}/{1e3 * q75:.0f} ms")  # fmt: skip
    if cold:
        q25, q50, q75 = np.percentile(cold, [25, 50, 75])
        print(f"pause, nothing onboarded: {len(cold)}, p25/p50/p75 "
              f"{1e3 * q25:.0f}/{1e3 * q50:.0f}/{1e3 * q75:.0f} ms")  # fmt: skip
    if onboarded and cold:
        fixed = statistics.median(cold)
        pages = sum(p for _, p in onboarded)
        per_page = (sum(pause for pause, _ in onboarded) - fixed * len(onboarded)) / pages
        print(f"pause, host pages onboarded: {len(onboarded)} ({pages:,} pages), "
              f"{1e3 * per_page:.3f} ms per page beyond the fixed part")  # fmt: skip
    if from_disk:
        print(f"pause, disk pages read: {len(from_disk)} admissions "
              f"({sum(d for _, _, d in from_disk):,} disk pages)")  # fmt: skip
    pieces_table(folders)


def folder_mixes(folder: Path, costs: CostModel | None = None) -> list[Mix]:
    """The mixes of the replays one folder's rank logs hold, in time order."""
    logs = sorted(folder.glob("steps-*.jsonl*"))
    per_rank = [split_replays(steps_of(log)) for log in logs]
    count = max(len(replays) for replays in per_rank)
    if any(len(replays) != count for replays in per_rank):
        raise SystemExit(f"{folder}: ranks hold {[len(r) for r in per_rank]} replays")
    return [mix_of([replays[i] for replays in per_rank], costs) for i in range(count)]


ROWS = (
    ("wall s", lambda m: f"{m.wall_s:.1f}"),
    ("steps", lambda m: f"{m.steps:,}"),
    ("prefill chunks", lambda m: f"{m.prefill_chunks:,}"),
    ("prefill M tokens", lambda m: f"{m.prefill_tokens / 1e6:.3f}"),
    ("of it from token 0, M", lambda m: f"{m.prefill_from_zero / 1e6:.3f}"),
    ("decode steps", lambda m: f"{m.decode_steps:,}"),
    ("mixed steps", lambda m: f"{m.mixed_steps:,}"),
    ("mean decode batch", lambda m: f"{m.mean_decode_batch:.2f}"),
    ("steps' s (sum)", lambda m: f"{m.step_s:.1f}"),
    ("short gaps s (sum)", lambda m: f"{m.short_gap_s:.1f}"),
    (
        "idle gaps: count / s / p50 ms",
        lambda m: f"{m.idle_gaps} / {m.idle_s:.1f} / {1e3 * m.idle_gap_p50_s:.0f}",
    ),
    ("ranks' spans s (sum)", lambda m: f"{m.rank_span_s:.1f}"),
    (
        "model s: prefill steps / decode steps",
        lambda m: f"{m.model_prefill_s:.1f} / {m.model_decode_s:.1f}",
    ),
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", type=Path, nargs="+")
    p.add_argument("--json", type=Path, default=None, help="write every run's mix here")
    p.add_argument("--sim", type=Path, default=None, help="price the steps with this YAML")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--starts", action="store_true", help="slot-to-start seconds by prompt")
    p.add_argument("--admissions", action="store_true", help="admission path and pause")
    args = p.parse_args()
    if args.starts:
        starts_table(args.folders)
        return
    if args.admissions:
        admissions_table(args.folders)
        return
    costs = None
    if args.sim:
        sim = load_sim_config(args.sim)
        costs = CostModel.from_figures(sim.model, sim.hardware, args.page_size)
    runs = {}
    for folder in args.folders:
        mixes = folder_mixes(folder, costs)
        for i, mix in enumerate(mixes):
            runs[f"{'/'.join(folder.parts[-2:])}{f' #{i + 1}' if len(mixes) > 1 else ''}"] = mix
    print("| measure | " + " | ".join(runs) + " |")
    print("|---|" + "---|" * len(runs))
    for name, show in ROWS:
        print(f"| {name} | " + " | ".join(show(mix) for mix in runs.values()) + " |")
    if args.json:
        args.json.write_text(json.dumps({k: asdict(m) for k, m in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
