"""Where the gaps between a sequence's tokens come from: a fleet's logged steps against the
simulator's.

Reads step logs, one folder per run (the engine's `steps-engine<i>.jsonl[.xz]` or the
simulator's `steps-rank-<i>.jsonl`, as bench/step_mix.py does: replays split, each once, the
warm-up left out). Every pair of a rank's consecutive steps that both decode is one gap per
sequence the second decodes (a token's inter-token latency, as the engine times it: step start
to step start), put in the first class that fits:

| class     | the gap                                                                      |
|-----------|------------------------------------------------------------------------------|
| prefill   | its second step also computes a prefill chunk (another request's)            |
| piece     | the rank paused over PAUSE_S between the steps and onboarded pages (a piece  |
|           | of a waiting request's prefix, docs/engine.md)                               |
| pause     | the rank paused over PAUSE_S between the steps, onboarding nothing           |
| long step | its first step ran over LONG_STEP_S (the chip shared, a long context)        |
| decode    | none of these                                                                |

Per run: the gaps' p50 and p90 weighted by tokens, and per class its share of the tokens, its
p50 gap, and its share of the tokens at or over the p90: what makes the tail (the replays'
`itl_p90_s`). A second table sets the pauses beside the plain decode gaps: the first step's
median seconds (a step planned ahead counts the wait for the tokens of the step before it, one
planned after them only its launch) and, where the log says so (`plan`, `ahead`, `waiting`),
the second step's median plan (the scheduler's part of the pause), the share of second steps
planned ahead and of those with a request waiting at the rank.

Run: .venv/bin/python bench/decode_gaps.py FOLDER...
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from step_mix import every_replay

PAUSE_S = 0.005  # longer between two steps: the core thread ran something else (step_line.py)
LONG_STEP_S = 0.015  # a decode step of this fleet's 1b ranks alone takes 4-8 ms
CLASSES = ("prefill", "piece", "pause", "long step", "decode")


def decode_pairs(steps: list[dict]) -> Iterator[tuple[dict, dict, str]]:
    """(first, second, class) of each pair of one rank's consecutive steps that both decode
    (classes: the module docstring)."""
    for first, second in itertools.pairwise(steps):
        if not first["decode"] or not second["decode"]:
            continue
        pause = second["t"] - first["t"] - first["s"]
        if second["prefill"]:
            kind = "prefill"
        elif pause > PAUSE_S:
            kind = "piece" if second["host_in"] or second["disk_in"] else "pause"
        elif first["s"] > LONG_STEP_S:
            kind = "long step"
        else:
            kind = "decode"
        yield first, second, kind


def decode_gaps(steps: list[dict]) -> list[tuple[float, int, str]]:
    """(gap, tokens, class) of each decode pair (`decode_pairs`): the second step's start minus
    the first's, the sequences the second decodes, the class."""
    return [
        (second["t"] - first["t"], len(second["decode"]), kind)
        for first, second, kind in decode_pairs(steps)
    ]


def pause_origins(
    steps: list[dict],
) -> dict[str, list[tuple[float, bool | None, int | None, float | None]]]:
    """For the pause and decode gaps of one rank's steps: per gap, the first step's seconds and
    the second's `ahead`, `waiting` and `plan` seconds (None where not logged)."""
    out: dict[str, list] = {"pause": [], "decode": []}
    for first, second, kind in decode_pairs(steps):
        if kind in out:
            fields = (second.get("ahead"), second.get("waiting"), second.get("plan"))
            out[kind].append((first["s"], *fields))
    return out


def origins_row(origins: dict[str, list]) -> list[str]:
    """Per class (pause, decode): gaps, the first step's p50 ms, the second's plan p50 ms, the
    second planned ahead, a request waiting."""
    cells = []
    for kind in ("pause", "decode"):
        rows = origins[kind]
        if not rows:
            cells.append("0 / - / - / - / -")
            continue
        first_ms = 1e3 * float(np.median([row[0] for row in rows]))
        ahead = [row[1] for row in rows if row[1] is not None]
        waiting = [row[2] for row in rows if row[2] is not None]
        plans = [row[3] for row in rows if row[3] is not None]
        ahead_cell = f"{np.mean(ahead):.0%}" if ahead else "-"
        waiting_cell = f"{np.mean([w > 0 for w in waiting]):.0%}" if waiting else "-"
        plan_cell = f"{1e3 * float(np.median(plans)):.2f}" if plans else "-"
        cells.append(
            f"{len(rows):,} / {first_ms:.2f} / {plan_cell} / {ahead_cell} / {waiting_cell}"
        )
    return cells


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The value below which a share `q` of the weight lies."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][np.searchsorted(cumulative, q)])


def gaps_row(gaps: list[tuple[float, int, str]]) -> dict:
    """One run's p50/p90 (s) and, per class, (token share, p50 gap in s, share at/over p90)."""
    values = np.array([gap for gap, _, _ in gaps])
    tokens = np.array([count for _, count, _ in gaps], dtype=float)
    p90 = weighted_quantile(values, tokens, 0.9)
    at_tail = values >= p90
    tail_tokens = tokens[at_tail].sum()
    per_class = {}
    for kind in CLASSES:
        mask = np.array([k == kind for _, _, k in gaps])
        if not mask.any():
            continue
        share = tokens[mask].sum() / tokens.sum()
        tail = tokens[mask & at_tail].sum() / tail_tokens
        per_class[kind] = (share, weighted_quantile(values[mask], tokens[mask], 0.5), tail)
    return {"p50": weighted_quantile(values, tokens, 0.5), "p90": p90, "classes": per_class}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", type=Path, nargs="+")
    args = p.parse_args()
    header = [f"{kind}: tokens / p50 ms / of the tail" for kind in CLASSES]
    print("| run | gaps | p50 / p90 ms | " + " | ".join(header) + " |")
    print("|---|---|---|" + "---|" * len(CLASSES))
    origins = []
    for folder in args.folders:
        replays = list(every_replay([folder]))
        gaps = [gap for replay in replays for gap in decode_gaps(replay)]
        merged: dict[str, list] = {"pause": [], "decode": []}
        for replay in replays:
            for kind, rows in pause_origins(replay).items():
                merged[kind] += rows
        origins.append((folder, origins_row(merged)))
        row = gaps_row(gaps)
        cells = []
        for kind in CLASSES:
            share, p50, tail = row["classes"].get(kind, (0.0, 0.0, 0.0))
            cells.append(f"{share:.1%} / {1e3 * p50:.0f} / {tail:.0%}")
        quantiles = f"{1e3 * row['p50']:.1f} / {1e3 * row['p90']:.1f}"
        name = "/".join(folder.parts[-2:])
        print(f"| {name} | {len(gaps):,} | {quantiles} | " + " | ".join(cells) + " |")
    print()
    cells = "gaps / first step p50 ms / its plan p50 ms / planned ahead / a request waiting"
    print(f"| run | pause: {cells} | decode: {cells} |")
    print("|---|---|---|")
    for folder, row in origins:
        print(f"| {'/'.join(folder.parts[-2:])} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
