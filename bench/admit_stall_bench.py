"""How long a decoding sequence waits while its rank admits a long prompt, and where that goes.

One EngineCore (a tiny model's weights with a forward that costs nothing, as in
`decode_host_bench.py`; the real scheduler, kvstore, tiers and page copies) decodes one
sequence A. Conversation B's first turn (PROMPT tokens) ran to its end; B's second turn resends
it with its output and 1,024 new tokens, as an agent's next turn does. Where B's prefix is:

- `device`: retained on the device since its first turn;
- `host`:   pushed to the host tier (another conversation of the same length filled the device
            after B's first turn), so admission onboards it;
- `disk`:   pushed, the same way, to a disk tier in a fresh folder (no host tier), so its
            blocks' files are read and checked (by the core thread, or by the background
            prefetch for a waiting request when it gets there first).

The core's turns from B's submission to the one that admits it are timed; A decodes in each.
`A's longest wait` is the longest of them (A's longest gap between two tokens), `hold` its part
before the step starts (the request's add and its admission: A runs nothing meanwhile), `step`
the step itself (A's decode and, in the admitting turn, B's first chunk; a free forward here).
`B: submitted to joined` sums the turns. The phases below are inclusive wall times of the calls
named, summed over those turns (nested ones indented). Page size as shipped (16), step budget
8,192 tokens. A prefix of more than `onboard_pages_per_step` (256) host/disk pages comes up in
pieces, a piece a turn (docs/engine.md): `pause per page onboarded` is the turns' time before
their steps over the pages onboarded, what the simulator's `admit_ms_per_host_page` and
`admit_ms_per_disk_page` are. `--kv-shape 1b` gives the KV pages the 1b preset's layout (16
layers, 8 KV heads of 64: 512 KiB a page in bf16, as the H100 fleet's), for the copies' and the
files' true sizes; the default is a tiny shape (the host work alone).

    .venv/bin/python bench/admit_stall_bench.py                       # 16k, 64k, 128k
    .venv/bin/python bench/admit_stall_bench.py --baseline main       # main beside this checkout
    .venv/bin/python bench/admit_stall_bench.py --prompts 131072 --where host --turns --profile
    python bench/admit_stall_bench.py --device cuda --kv-shape 1b --prompts 65536 --where host,disk

`--disk-read-threads N` and `--disk-write-behind` set the engine's `disk_read_threads` and
`disk_write_behind` (an A/B of a default on one tree).
`--baseline REF` runs the same cases, with this file's code, on git REF's `kvstore/`,
`services/` and `proto/` (a subprocess importing them as `kvfleet`), alternating with this
checkout case by case so that both see the same load. Each case is run `--repeats` times (a
fresh core each) and the repeat whose `A waits` is the median counts.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from host_bench_parts import (  # noqa: E402
    FreeModel,
    MethodTimer,
    baseline_tree,
    register_host_shape,
)
from kvfleet.services.engine.compute.backends import TorchCompute  # noqa: E402
from kvfleet.services.engine.compute.sampling import SamplingParams  # noqa: E402
from kvfleet.services.engine.config.engine_config import EngineConfig  # noqa: E402
from kvfleet.services.engine.config.model_config import PRESETS, ModelConfig  # noqa: E402
from kvfleet.services.engine.core.engine_core import EngineCore  # noqa: E402
from kvfleet.services.engine.request.engine_request import GenerateCall  # noqa: E402

NEW_TOKENS = 1024  # what B's second turn adds after its first turn and output
STEP_TOKENS = 8192  # the H100 fleet's max_num_batched_tokens
PAGE = 16  # EngineConfig's page size


HOST_SHAPE = register_host_shape("admit-shape", 262144)
KV_1B_SHAPE = "admit-1b-kv"


def register_1b_kv_shape() -> str:
    """The tiny shape with the 1b preset's KV layout (the forward is free either way)."""

    def shape() -> ModelConfig:
        return dataclasses.replace(
            PRESETS[HOST_SHAPE](), num_layers=16, num_heads=8, num_kv_heads=8, head_dim=64,
            name=KV_1B_SHAPE,
        )  # fmt: skip

    PRESETS.setdefault(KV_1B_SHAPE, shape)
    return KV_1B_SHAPE


SHAPES = {"tiny": HOST_SHAPE, "1b": register_1b_kv_shape()}


class Phases(MethodTimer):
    """`MethodTimer` that also marks when the step after the admission starts."""

    def __init__(self) -> None:
        super().__init__()
        self.step_started: float | None = None

    def mark_step(self, core) -> None:
        original = core._step

        def step(chunks):
            if self.on:
                self.step_started = time.perf_counter()
            return original(chunks)

        core._step = step


PHASES = [
    # (owner path, attribute, name); inclusive, nested names indented
    ("core", "_run_commands", "add (commands)"),
    ("manager", "add_request", "  kvstore: hash prompt"),
    ("block_tokens", "extend", "  KV events: track the prompt's blocks"),
    ("scheduler", "schedule", "schedule (admission)"),
    ("manager", "match", "  prefix match (each call)"),
    ("manager", "admit", "  admit"),
    ("tiers", "stage", "    stage host/disk blocks"),
    ("pools", "take", "    take pages (device evictions)"),
    ("tiers", "flush", "    offload evicted pages"),
    ("tiers", "onboard", "    copy host -> device"),
    ("core", "_flush_events", "KV events out"),
]


def owners(core) -> dict[str, list]:
    return {
        "core": [core],
        "manager": [core.manager],
        "scheduler": [core.scheduler],
        "block_tokens": [core._block_tokens],
        "tiers": [core.manager.tiers],
        "pools": list(core.manager.pools.values()),
    }


def new_core(
    prompt: int, where: str, args: argparse.Namespace, disk_dir: str
) -> tuple[EngineCore, TorchCompute]:
    prompt_pages = -(-(prompt + NEW_TOKENS + 64) // PAGE)
    # host/disk: the device holds about one prompt, so that another one pushes B's down
    # host+disk: a fleet rank's tiers (host pages and a shared disk folder), B's blocks on host
    on_host, on_disk = where in ("host", "host+disk"), where in ("disk", "host+disk")
    pushed = on_host or on_disk
    device_pages = prompt_pages + 400 if pushed else 2 * prompt_pages + 600
    config = EngineConfig(
        model=SHAPES[args.kv_shape],
        device=args.device,
        decode_graphs="off",
        max_batch_size=2,
        max_num_batched_tokens=STEP_TOKENS,
        page_size=PAGE,
        kv_pages=device_pages,
        host_kv_pages=3 * prompt_pages if on_host else None,
        disk_tier_dir=disk_dir if on_disk else "",
        disk_kv_pages=3 * prompt_pages if on_disk else None,
        disk_write_behind=args.disk_write_behind,
        **({"disk_read_threads": args.disk_read_threads} if args.disk_read_threads else {}),
    )
    compute = TorchCompute(config)
    core = EngineCore(config, compute=compute)
    free = FreeModel(compute.model_config.vocab_size)
    compute.model = free
    if getattr(compute, "decode", None) is not None:
        compute.decode.model = free
    return core, compute


def drain(handle) -> list[tuple[int, ...]]:
    """The outputs a handle holds now: (token ids, ended) each."""
    got = []
    while (output := handle.poll()) is not None:
        if isinstance(output, Exception):
            raise output
        got.append((tuple(output.token_ids), output.usage is not None))
    return got


def run_to_end(core: EngineCore, handle, decoding) -> list[int]:
    """Turn the core until `handle`'s request ends (reading A's tokens as they come); its
    tokens."""
    tokens: list[int] = []
    while True:
        core.run_once()
        drain(decoding)
        for ids, ended in drain(handle):
            tokens.extend(ids)
            if ended:
                return tokens


def timed_turns(core: EngineCore, decoding, count: int) -> list[float]:
    """Seconds of each of `count` core turns (reading the decoding request's tokens)."""
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        core.run_once()
        seconds.append(time.perf_counter() - started)
        drain(decoding)
    return seconds


def one_admission(
    prompt: int, where: str, args: argparse.Namespace, profile: bool
) -> dict[str, float]:
    """Seconds of the admitting turn, its hold and step, and each phase; pages onboarded."""
    with tempfile.TemporaryDirectory(prefix="admit-stall-") as disk_dir:
        return admission_in(prompt, where, args, profile, disk_dir)


def admission_in(
    prompt: int, where: str, args: argparse.Namespace, profile: bool, disk_dir: str
) -> dict[str, float]:
    rng = random.Random(prompt)
    core, _ = new_core(prompt, where, args, disk_dir)
    decoding = core.submit(
        GenerateCall("a", tuple(rng.randrange(256) for _ in range(64)),
                     SamplingParams(max_tokens=2000), "conv-a")
    )  # fmt: skip
    first_prompt = tuple(rng.randrange(256) for _ in range(prompt))
    first = core.submit(GenerateCall("b1", first_prompt, SamplingParams(max_tokens=4), "conv-b"))
    output = run_to_end(core, first, decoding)
    if where in ("host", "disk"):
        filler = core.submit(
            GenerateCall("fill", tuple(rng.randrange(256) for _ in range(prompt + 4096)),
                         SamplingParams(max_tokens=1), "conv-fill")
        )  # fmt: skip
        run_to_end(core, filler, decoding)
    tiers = core.manager.tiers.metrics
    for _ in range(5):
        core.run_once()
    decode_steps = timed_turns(core, decoding, 10)
    phases = Phases()
    objects = owners(core)
    for owner, attribute, name in PHASES:
        for thing in objects[owner]:
            phases.wrap(thing, attribute, name)
    phases.mark_step(core)
    host_out, disk_out = tiers["host"].pages_out, tiers["disk"].pages_out
    second_prompt = (*first_prompt, *output, *(rng.randrange(256) for _ in range(NEW_TOKENS)))
    second = core.submit(GenerateCall("b2", second_prompt, SamplingParams(max_tokens=4), "conv-b"))
    a_before = len(core._sequences["a"][0].output)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    phases.on = True
    sequence = None
    turns: list[tuple[float, float]] = []  # (wall, hold) of each turn until B joins
    while sequence is None or not sequence.admitted:
        assert len(turns) < 10_000, "B's second turn is never admitted"
        phases.step_started = None
        started = time.perf_counter()
        core.run_once()
        ended = time.perf_counter()
        turns.append((ended - started, (phases.step_started or ended) - started))
        sequence = core._sequences["b2"][0]
    phases.on = False
    if profiler is not None:
        import pstats

        profiler.disable()
        print(f"\n## cProfile of the turns until B joins, prompt {prompt}, prefix on {where}")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(22)
    decoded = len(core._sequences["a"][0].output) - a_before
    assert decoded == len(turns), "A decodes in every turn"
    onboarded = tiers["host"].pages_out - host_out
    read = tiers["disk"].pages_out - disk_out
    run_to_end(core, second, decoding)
    core.manager.check_integrity()
    core.stop()
    if args.turns:
        print(
            f"{prompt}/{where}: ms of each turn until B joins",
            [round(w * 1e3, 1) for w, _ in turns],
        )
    longest, hold = max(turns)
    out = {
        "A's longest wait (one turn)": longest,
        "  hold (before its step starts)": hold,
        "  its step (A's decode, maybe B's first chunk)": longest - hold,
        "A waits, plain decode turn (median)": statistics.median(decode_steps),
        "B: submitted to joined (sum of turns)": sum(wall for wall, _ in turns),
        "turns until B joins": float(len(turns)),
    }
    for _, _, name in PHASES:
        out[name] = phases.totals.get(name, 0.0)
    out["  prefix match calls"] = float(phases.calls.get("  prefix match (each call)", 0))
    out["reused tokens"] = float(sequence.cached_tokens or 0)
    out["host pages onboarded"] = float(onboarded)
    out["disk pages read (admission or prefetch)"] = float(read)
    paused = sum(hold for _, hold in turns)
    out["pause per page onboarded"] = paused / (onboarded + read) if onboarded + read else 0.0
    return out


COUNTS = (
    "turns until B joins",
    "  prefix match calls",
    "reused tokens",
    "host pages onboarded",
    "disk pages read (admission or prefetch)",
)


def measure(args) -> dict[str, dict[str, float]]:
    """Per case `PROMPT/where`: the median repeat's figures."""
    torch.set_num_threads(1)
    out = {}
    for prompt in (int(p) for p in args.prompts.split(",")):
        for where in args.where.split(","):
            runs = [
                one_admission(prompt, where, args, args.profile and r == 0)
                for r in range(args.repeats)
            ]
            runs.sort(key=lambda r: r["A's longest wait (one turn)"])
            out[f"{prompt}/{where}"] = runs[len(runs) // 2]
    return out


def measure_baseline(shim: Path, args, prompt: int, where: str) -> dict[str, float]:
    """One case measured in a subprocess on the baseline's kvfleet."""
    command = [sys.executable, __file__, "--json", "--prompts", str(prompt), "--where", where]
    command += ["--repeats", str(args.repeats), "--device", args.device]
    command += ["--kv-shape", args.kv_shape]
    # the same engine settings on both sides (a ref without them fails on a non-default)
    if args.disk_read_threads:
        command += ["--disk-read-threads", str(args.disk_read_threads)]
    if args.disk_write_behind:
        command.append("--disk-write-behind")
    env = {**os.environ, "PYTHONPATH": str(shim)}
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])[f"{prompt}/{where}"]


def cell(name: str, value: float) -> float:
    return value if name in COUNTS else value * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="16384,65536,131072", help="B's first-turn tokens")
    parser.add_argument("--where", default="device,host", help="where B's prefix is")
    parser.add_argument("--repeats", type=int, default=3, help="the median repeat counts")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kv-shape", choices=sorted(SHAPES), default="tiny",
                        help="KV page layout (1b: the 1b preset's 512 KiB pages)")  # fmt: skip
    parser.add_argument("--disk-read-threads", type=int, default=0,
                        help="block files an admission reads at once (0: default)")  # fmt: skip
    parser.add_argument("--disk-write-behind", action="store_true",
                        help="block files written by a thread of their own")  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="cProfile the turns until B joins")
    parser.add_argument("--turns", action="store_true", help="print each turn's ms until B joins")
    parser.add_argument("--baseline", help="git ref to measure beside this checkout")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:  # a baseline's subprocess: one line of results
        print(json.dumps(measure(args)))
        return
    title = f"admission of a resent prompt while A decodes (page {PAGE}, free forward), ms"
    if not args.baseline:
        rows = []
        for case, figures in measure(args).items():
            rows += [[case, name, cell(name, value)] for name, value in figures.items()]
        print_table(title, ["prompt/prefix on", "phase", "ms (count)"], rows)
        return
    shim = baseline_tree(args.baseline)
    rows = []
    for prompt in (int(p) for p in args.prompts.split(",")):
        for where in args.where.split(","):
            case = f"{prompt}/{where}"
            before = measure_baseline(shim, args, prompt, where)
            after = measure(argparse.Namespace(**{**vars(args), "prompts": str(prompt),
                                                  "where": where}))[case]  # fmt: skip
            for name in dict.fromkeys([*before, *after]):
                old, new = cell(name, before.get(name, 0.0)), cell(name, after.get(name, 0.0))
                ratio = old / new if new and name not in COUNTS else "-"
                rows.append([case, name, old, new, ratio])
    print_table(
        f"{title}: {args.baseline} vs this checkout",
        ["prompt/prefix on", "phase", args.baseline, "this", "speed-up"],
        rows,
    )


if __name__ == "__main__":
    main()
