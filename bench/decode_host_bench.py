"""Host work of a decode step through EngineCore, by phase, on the CPU: the serving path with
a forward that costs nothing (logits of zeros), so what is left is the scheduler, the kvstore
calls, the static buffers' filling, the tokens' trip back and the per-token output handling.

    .venv/bin/python bench/decode_host_bench.py                 # batch 64 and 256, ctx 2,000
    .venv/bin/python bench/decode_host_bench.py --batches 64 --steps 20 --profile
    .venv/bin/python bench/decode_host_bench.py --baseline main  # main's engine beside this one

`--baseline REF` runs the same cases, with this file's code, on git REF's `kvstore/`, `services/`
and `proto/` (a subprocess importing them as `kvfleet`), alternating with this checkout's runs
case by case so that both see the same load; the table prints both.

The model shape is one attention group, as the 1b/8b presets have (a tiny model's weights,
context 131,072 so that page tables are as wide); page 128. Times are CPU time of the thread
(the machine may be shared, and the step has no other thread to wait for). Once the batch
decodes, the startup heap is frozen out of the GC's full passes as `kvfleet engine` does
(`gc_heap.py`; not for a baseline without it, nor with `--no-freeze`), and the outputs are read
after each round, as clients read them. `step` is the quickest of rounds with nothing wrapped,
`step, mean of all rounds` their mean, full GC passes included (their share printed below it);
the phases, inclusive times of the calls named summed per step (`emit` contains
`append_tokens`), come from rounds after with those calls wrapped, so each wrapped call's own
cost (~0.3 us) lands in its phase: a per-token path pays it per token.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
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
from kvfleet.services.engine.core.engine_core import EngineCore  # noqa: E402
from kvfleet.services.engine.request.engine_request import GenerateCall  # noqa: E402

try:
    from kvfleet.services.engine.core.gc_heap import freeze_startup_heap, thaw_heap
except ImportError:  # a baseline whose serving process freezes nothing
    freeze_startup_heap = thaw_heap = None


HOST_SHAPE = register_host_shape("host-shape", 131072)


class PhaseTimer(MethodTimer):
    """`MethodTimer` on the thread's CPU time, with `launch` timed in two parts."""

    def __init__(self) -> None:
        super().__init__(time.thread_time)

    def wrap_launch(self, compute) -> None:
        """`launch` and the call it returns (the wait for the step's tokens) apart."""
        original = compute.launch

        def launch(chunks, *rest):
            start = time.thread_time()
            finish = original(chunks, *rest)
            if self.on:
                self.totals["launch: batch + buffers"] += time.thread_time() - start

            def timed_finish():
                begin = time.thread_time()
                tokens = finish()
                if self.on:
                    self.totals["finish: tokens to host"] += time.thread_time() - begin
                return tokens

            timed_finish.device_tokens = getattr(finish, "device_tokens", None)
            return timed_finish

        compute.launch = launch


def run_case(
    batch: int, prompt: int, steps: int, rounds: int, page: int, profile: bool, freeze: bool = True
):
    config = EngineConfig(
        model=HOST_SHAPE,
        device="cpu",
        decode_graphs="static",
        max_batch_size=batch,
        max_num_batched_tokens=16384,
        page_size=page,
        kv_pages=batch * (-(-(prompt + 2 * steps * rounds + batch) // page)) + 64,
    )
    compute = TorchCompute(config)
    core = EngineCore(config, compute=compute)
    free = FreeModel(compute.model_config.vocab_size)
    compute.model = free
    compute.decode.model = free
    rng = random.Random(0)
    handles = []
    for i in range(batch):
        tokens = tuple(rng.randrange(256) for _ in range(prompt))
        call = GenerateCall(
            f"r{i}", tokens, SamplingParams(max_tokens=2 * steps * rounds + batch), f"c{i}"
        )
        handles.append(core.submit(call))
    core.run_once()
    while not all(s.context_done for s in core.scheduler.running) or core.scheduler.waiting:
        core.run_once()
    for _ in range(3):  # warm
        core.run_once()
    if freeze and freeze_startup_heap is not None:
        freeze_startup_heap()  # as the serving process does once started
    # The machine is shared: of `rounds` rounds of `steps` steps, the quickest one counts. The
    # step's time comes from rounds with nothing wrapped, the phases from rounds after.
    passes = FullPasses()
    gc.callbacks.append(passes.record)
    step_rounds = [timed_steps(core, steps, handles) for _ in range(rounds)]
    gc.callbacks.remove(passes.record)
    timer = PhaseTimer()
    timer.wrap(core.scheduler, "schedule", "schedule")
    # Each name sums the per-sequence call and, where it exists, its one call per step.
    timer.wrap(core.manager, "commit", "commit")
    timer.wrap(core.manager, "commit_all", "commit")
    timer.wrap(core, "_emit", "emit (tokens out: kvstore, tracker, metrics, queues)")
    timer.wrap(core, "_emit_step", "emit (tokens out: kvstore, tracker, metrics, queues)")
    timer.wrap(core.manager, "append_tokens", "  append_tokens (in emit)")
    timer.wrap(core.manager, "append_tokens_all", "  append_tokens (in emit)")
    timer.wrap_launch(compute)
    timer.on = True
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    best = None
    for _ in range(rounds):
        timer.totals.clear()
        total = timed_steps(core, steps, handles)
        if best is None or total < best[0]:
            best = (total, dict(timer.totals))
    total, phases = best
    if profiler is not None:
        import pstats

        profiler.disable()
        print(f"\n## cProfile, batch {batch}, {steps} steps")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
    timer.on = False
    assert len(core.scheduler.running) == batch, "every sequence decodes in every timed step"
    core.stop()
    named = sum(v for k, v in phases.items() if not k.startswith(" "))
    phases["other (loop, events, load)"] = total - named
    if freeze and thaw_heap is not None:
        thaw_heap()
    head = {
        "step": min(step_rounds) / steps,
        "step, mean of all rounds": sum(step_rounds) / len(step_rounds) / steps,
        "  full GC passes in them (sum / step)": passes.seconds / (steps * rounds),
    }
    return head, phases


class FullPasses:
    """Time spent in the collector's oldest-generation passes (a `gc.callbacks` entry)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def record(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._start


def timed_steps(core: EngineCore, steps: int, handles: list) -> float:
    """CPU seconds of the thread for `steps` turns of the core; then the outputs are read, as
    clients read them (untimed), so that they do not pile up."""
    start = time.thread_time()
    for _ in range(steps):
        core.run_once()
    seconds = time.thread_time() - start
    for handle in handles:
        while handle.poll() is not None:
            pass
    return seconds


def measure(args) -> dict[int, dict[str, float]]:
    """Per batch: us per step of the step (quickest round, mean of all) and of each phase."""
    torch.set_num_threads(1)
    out = {}
    for batch in (int(b) for b in args.batches.split(",")):
        head, phases = run_case(
            batch,
            args.prompt,
            args.steps,
            args.rounds,
            args.page_size,
            args.profile,
            not args.no_freeze,
        )
        out[batch] = {k: v * 1e6 for k, v in head.items()}
        out[batch].update({k: v / args.steps * 1e6 for k, v in phases.items()})
    return out


def measure_baseline(shim: Path, args, batch: int) -> dict[str, float]:
    """One batch measured in a subprocess on the baseline's kvfleet."""
    command = [sys.executable, __file__, "--json", "--batches", str(batch)]
    command += ["--prompt", str(args.prompt), "--steps", str(args.steps)]
    command += ["--rounds", str(args.rounds), "--page-size", str(args.page_size)]
    command += ["--no-freeze"] if args.no_freeze else []
    env = {**os.environ, "PYTHONPATH": str(shim)}
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])[str(batch)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--prompt", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="the quickest round counts")
    parser.add_argument("--page-size", type=int, default=128)
    parser.add_argument("--profile", action="store_true", help="cProfile the timed steps")
    parser.add_argument("--baseline", help="git ref to measure beside this checkout")
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the startup heap in the GC's passes (the serving process freezes it)",
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:  # a baseline's subprocess: one line of results
        print(json.dumps(measure(args)))
        return
    title = f"host work per decode step (ctx {args.prompt}, page {args.page_size}, free forward)"
    if not args.baseline:
        rows = []
        for batch, times in measure(args).items():
            rows += [[batch, name, us, us / batch] for name, us in times.items()]
        print_table(title, ["batch", "phase", "us / step", "us / sequence"], rows)
        return
    shim = baseline_tree(args.baseline)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        before = measure_baseline(shim, args, batch)
        after = measure(argparse.Namespace(**{**vars(args), "batches": str(batch)}))[batch]
        for name in dict.fromkeys([*before, *after]):
            old, new = before.get(name, 0.0), after.get(name, 0.0)
            rows.append([batch, name, old / batch, new / batch, old / new if new else "-"])
    print_table(
        f"{title}: {args.baseline} vs this checkout, us per sequence",
        ["batch", "phase", f"{args.baseline}", "this", "speed-up"],
        rows,
    )


if __name__ == "__main__":
    main()
