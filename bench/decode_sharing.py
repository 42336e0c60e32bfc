"""Decode steps by batch and by what else ran on the chip: a fleet's logged steps against the
simulator's, like with like.

Reads step logs, one folder per run (the engine's `steps-engine<i>.jsonl[.xz]` or the
simulator's `steps-rank-<i>.jsonl`, as bench/step_mix.py does; appended replays split, the
warm-up left out) and keeps each rank's decode-only steps that its next step follows at once
and that is a decode-only step too (a steady decode: the time between two tokens). Each is
put in a class by its batch and by what other ranks ran meanwhile (their steps' logged spans
over its cycle, start to the rank's next start): `solo` (under 5 % of the cycle covered),
`with prefill` (an overlapping step computes a prefill chunk), else `with decode`. Per class:
the count a replay, the share of the batch's steps, the cycle's mean, p50 and p90 and the
mean context summed over the batch.

A hardware prefill step's logged seconds stop at its launch (its GPU wait falls in the next
step's), so on hardware `with prefill` is undercounted, and `with decode` overcounted.

Run: .venv/bin/python bench/decode_sharing.py --hw FOLDER... --sim FOLDER...
"""

from __future__ import annotations

import argparse
import itertools
from collections import defaultdict
from pathlib import Path

import numpy as np
from step_costs import IDLE_S, SOLO_SHARE, covered_by_others, rank_spans, steps_of
from step_mix import split_replays

CLASSES = ("solo", "with decode", "with prefill")


def replays_of(folder: Path) -> list[list[list[dict]]]:
    """Each replay a folder holds, as its ranks' steps in time order."""
    per_rank = [split_replays(steps_of(log)) for log in sorted(folder.glob("steps-*.jsonl*"))]
    count = max(len(replays) for replays in per_rank)
    return [[replays[i] for replays in per_rank if i < len(replays)] for i in range(count)]


def steady_decodes(ranks: list[list[dict]]) -> list[tuple[int, str, float, int]]:
    """(batch, class, cycle seconds, summed context) of each steady decode of one replay."""
    spans = rank_spans(ranks)
    out = []
    for r, steps in enumerate(ranks):
        for step, after in itertools.pairwise(steps):
            if step["prefill"] or after["prefill"] or not step["decode"]:
                continue
            cycle = after["t"] - step["t"]
            if cycle > step["s"] + IDLE_S:
                continue
            covered, prefill = covered_by_others(spans, r, step["t"], after["t"])
            kind = CLASSES[0] if covered < SOLO_SHARE * cycle else CLASSES[2 if prefill else 1]
            out.append((len(step["decode"]), kind, cycle, sum(step["decode"])))
    return out


def table(label: str, folders: list[Path]) -> None:
    """Markdown rows of one side's steady decodes by batch and class."""
    replays = [replay for folder in folders for replay in replays_of(folder)]
    rows = [row for replay in replays for row in steady_decodes(replay)]
    by: dict[tuple[int, str], list[tuple[float, int]]] = defaultdict(list)
    for batch, kind, cycle, context in rows:
        by[batch, kind].append((cycle, context))
        by[batch, "all"].append((cycle, context))
    for batch in sorted({batch for batch, _ in by}):
        every = len(by[batch, "all"])
        for kind in (*CLASSES, "all"):
            cells = by.get((batch, kind))
            if not cells:
                continue
            cycles = 1e3 * np.array([cycle for cycle, _ in cells])
            context = np.mean([c for _, c in cells]) / 1e3
            print(f"| {label} | x{batch} | {kind} | {len(cells) / len(replays):,.0f} | "
                  f"{len(cells) / every:.1%} | {cycles.mean():.1f} / {np.median(cycles):.1f} / "
                  f"{np.percentile(cycles, 90):.1f} | {context:.0f}k |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hw", type=Path, nargs="+", required=True, help="logged replays' folders")
    p.add_argument("--sim", type=Path, nargs="*", default=[], help="the simulator's folders")
    args = p.parse_args()
    print("| side | batch | class | a replay | of the batch | cycle mean / p50 / p90 ms | "
          "context |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    table("hardware", args.hw)
    if args.sim:
        table("simulator", args.sim)


if __name__ == "__main__":
    main()
