"""What a turn waiting for room costs the sequence decoding beside it, step after step.

One EngineCore (the tiny model's weights with a forward that costs nothing, as in
`admit_stall_bench.py`; the real scheduler, kvstore and host tier) holds conversation B's
first turn (PROMPT tokens), which a long prompt then pushes to the host tier. A (0.6 x PROMPT
tokens) decodes; B's second turn resends its prompt with 1,024 new tokens and does not fit
beside A. Its prefix first comes up in pieces of `onboard_pages_per_step` (256) while room
lasts (docs/engine.md), then it waits until A ends. The rank asks it every step, so every one
of A's steps pays that question before it starts.

Each case runs with the host tier alone, and with the host tier and a shared disk folder as a
fleet's ranks have (`--tiers`): a match that read a shared folder is trusted only for a short
window (kvstore/tiers/stack.py), so there the rank may walk more often.

Per case, the core's turns (host ms, the forward free): A's plain decode turn before B came,
the turns that brought a piece up, and the turns in which B waited with no piece (their p50
and p90), with the prefix walks (`match_prompt`) per waiting turn. The H100 fleet's step logs
showed those turns as 12-14 ms pauses between decode steps (docs/sim-vs-live.md, twentieth
look).

    .venv/bin/python bench/waiting_turn_bench.py                      # 65,536 and 131,072
    .venv/bin/python bench/waiting_turn_bench.py --baseline HEAD~1    # a ref beside this tree

`--baseline REF` runs the same cases, with this file's code, on git REF's `kvstore/`,
`services/` and `proto/` (a subprocess importing them as `kvfleet`), case by case beside this
checkout so that both see the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import import_engine, print_table

import_engine()

from admit_stall_bench import (  # noqa: E402
    NEW_TOKENS,
    drain,
    new_core,
    run_to_end,
    timed_turns,
)
from host_bench_parts import baseline_tree  # noqa: E402
from kvfleet.kvstore import manager as manager_module  # noqa: E402
from kvfleet.kvstore.tiers.metrics import DEVICE  # noqa: E402
from kvfleet.services.engine.compute.sampling import SamplingParams  # noqa: E402
from kvfleet.services.engine.request.engine_request import GenerateCall  # noqa: E402

A_SHARE = 0.6  # A's prompt, of B's: B's second turn does not fit beside it


def one_case(prompt: int, turns: int, tiers: str) -> dict[str, float]:
    """The figures of one case (module docstring), in seconds and counts."""
    args = argparse.Namespace(
        kv_shape="tiny", device="cpu", disk_write_behind=False, disk_read_threads=0
    )
    walks = [0]
    walk = manager_module.match_prompt

    def counted(*a, **k):
        walks[0] += 1
        return walk(*a, **k)

    manager_module.match_prompt = counted
    with tempfile.TemporaryDirectory(prefix="waiting-turn-") as disk_dir:
        core, _ = new_core(prompt, tiers, args, disk_dir)
        try:
            return measured(core, prompt, turns, walks)
        finally:
            core.stop()
            manager_module.match_prompt = walk


def measured(core, prompt: int, turns: int, walks: list[int]) -> dict[str, float]:
    rng = random.Random(prompt)
    quiet = core.submit(GenerateCall("x", (1, 2, 3), SamplingParams(max_tokens=1), "conv-x"))
    first_prompt = tuple(rng.randrange(256) for _ in range(prompt))
    first = core.submit(GenerateCall("b1", first_prompt, SamplingParams(max_tokens=4), "conv-b"))
    output = run_to_end(core, first, quiet)
    filler = tuple(rng.randrange(256) for _ in range(prompt + 4096))
    run_to_end(
        core,
        core.submit(GenerateCall("fill", filler, SamplingParams(max_tokens=1), "conv-fill")),
        quiet,
    )
    a_prompt = tuple(rng.randrange(256) for _ in range(int(prompt * A_SHARE)))
    decoding = core.submit(
        GenerateCall("a", a_prompt, SamplingParams(max_tokens=turns + 400), "conv-a")
    )
    while "a" not in core._sequences or not core._sequences["a"][0].context_done:
        core.run_once()
        drain(decoding)
    plain = timed_turns(core, decoding, 20)
    second_prompt = (*first_prompt, *output, *(rng.randrange(256) for _ in range(NEW_TOKENS)))
    core.submit(GenerateCall("b2", second_prompt, SamplingParams(max_tokens=4), "conv-b"))
    pages_in = core.manager.tiers.metrics[DEVICE]
    piece, waiting, waiting_walks = [], [], 0
    for _ in range(turns):
        before, walked = pages_in.pages_in, walks[0]
        started = time.perf_counter()
        core.run_once()
        seconds = time.perf_counter() - started
        drain(decoding)
        sequence = core._sequences.get("b2", [None])[0]
        if sequence is not None and sequence.admitted:
            raise SystemExit(f"{prompt}: B found room beside A; the case measures nothing")
        if pages_in.pages_in > before:
            piece.append(seconds)
        elif sequence is not None:
            waiting.append(seconds)
            waiting_walks += walks[0] - walked
    if not waiting:
        raise SystemExit(f"{prompt}: B never waited without a piece in {turns} turns")
    return {
        "A's plain decode turn, p50": statistics.median(plain),
        "turns that brought a piece up": float(len(piece)),
        "  a piece's turn, p50": statistics.median(piece) if piece else 0.0,
        "turns B waited with no piece": float(len(waiting)),
        "  a waiting turn, p50": statistics.median(waiting),
        "  a waiting turn, p90": statistics.quantiles(waiting, n=10)[-1],
        "  prefix walks per waiting turn": waiting_walks / len(waiting),
    }


COUNTS = ("turns that brought a piece up", "turns B waited with no piece", "prefix walks")


def cell(name: str, value: float) -> float:
    return round(value, 2) if any(c in name for c in COUNTS) else value * 1e3


def measure_baseline(shim: Path, prompt: int, turns: int, tiers: str) -> dict[str, float]:
    command = [sys.executable, __file__, "--json", "--prompts", str(prompt)]
    command += ["--turns", str(turns), "--tiers", tiers]
    env = {**os.environ, "PYTHONPATH": str(shim)}
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])[f"{prompt} {tiers}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="65536,131072", help="B's first-turn tokens")
    parser.add_argument("--turns", type=int, default=200, help="turns measured after B came")
    parser.add_argument("--tiers", default="host,host+disk",
                        help="the rank's lower tiers per case: host, or host and a shared disk "
                        "folder (as a fleet's ranks)")  # fmt: skip
    parser.add_argument("--baseline", help="git ref to measure beside this checkout")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [(int(p), tiers) for tiers in args.tiers.split(",") for p in args.prompts.split(",")]
    if args.json:  # a baseline's subprocess: one line of results
        print(json.dumps({f"{p} {t}": one_case(p, args.turns, t) for p, t in cases}))
        return
    title = "a turn waiting for room beside a decode: the core's turns (free forward), ms"
    if not args.baseline:
        rows = [
            [prompt, tiers, name, cell(name, value)]
            for prompt, tiers in cases
            for name, value in one_case(prompt, args.turns, tiers).items()
        ]
        print_table(title, ["B's prompt", "tiers", "turns", "ms (count)"], rows)
        return
    shim = baseline_tree(args.baseline)
    rows = []
    for prompt, tiers in cases:
        before = measure_baseline(shim, prompt, args.turns, tiers)
        after = one_case(prompt, args.turns, tiers)
        for name in after:
            old, new = cell(name, before[name]), cell(name, after[name])
            rows.append([prompt, tiers, name, old, new])
    print_table(f"{title}: {args.baseline} vs this checkout", ["B's prompt", "tiers", "turns",
                args.baseline, "this"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
