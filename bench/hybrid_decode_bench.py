"""Decode steps of the hybrid-small model on the CPU: the SSM layers stepped one sequence at a
time (the per-sequence loop) against one batched step for all sequences (`ssm_step.py`).

    .venv/bin/python bench/hybrid_decode_bench.py                 # batch 1, 8, 64
    .venv/bin/python bench/hybrid_decode_bench.py --batches 8 --steps 10

Each batch's sequences are prefilled (`--prompt` tokens each), then both paths run `--steps`
decode steps through the model's paged forward (the engine's eager step: ForwardBatch, paged
attention, state pages) from the same starting pages; tok/s = batch * steps / time, the median
of `--repeats` runs. Time is the thread's CPU time (torch runs on this one thread): the machine
may be shared. The model's forward only: no scheduler, no sampling.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import import_engine, print_table

import_engine()

from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk  # noqa: E402
from kvfleet.services.engine.compute.backends import TorchCompute  # noqa: E402
from kvfleet.services.engine.config.engine_config import EngineConfig  # noqa: E402
from kvfleet.services.engine.model.paged_ssm import SSMBatchPlan  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


@contextlib.contextmanager
def per_sequence():
    """The baseline: every chunk's SSM layers on their own, a decode by the recurrence."""
    plan = SSMBatchPlan.of
    SSMBatchPlan.of = SSMBatchPlan.each
    try:
        yield
    finally:
        SSMBatchPlan.of = plan


class Bench:
    def __init__(self, args: argparse.Namespace, max_batch: int) -> None:
        self.args = args
        self.page = 16
        per_seq = -(-(args.prompt + args.steps + 1) // self.page)
        config = EngineConfig(
            model="hybrid-small",
            device="cpu",
            max_batch_size=max_batch,
            page_size=self.page,
            kv_pages=max_batch * per_seq + 2,
            torch_threads=1,
        )
        self.compute = TorchCompute(config)
        self.compute.open_tiers()
        self.cache, self.per_seq = self.compute.cache, per_seq

    def pages(self, row: int) -> dict[str, tuple[int, ...]]:
        first = 1 + row * self.per_seq
        return dict.fromkeys(self.cache.num_pages, tuple(range(first, first + self.per_seq)))

    def forward(self, chunks: list[SequenceChunk]) -> torch.Tensor:
        batch = ForwardBatch.build(chunks, self.cache)
        return self.compute.model(batch, self.cache, self.compute.attention)

    def prefill(self, batch: int) -> None:
        rng = random.Random(batch)
        for row in range(batch):
            prompt = [rng.randrange(256) for _ in range(self.args.prompt)]
            self.forward([SequenceChunk(prompt, 0, self.pages(row))])

    def decode(self, batch: int) -> float:
        """CPU seconds for `--steps` greedy decode steps of `batch` sequences."""
        tokens = [1] * batch
        started = time.thread_time()
        for step in range(self.args.steps):
            start = self.args.prompt + step
            chunks = [SequenceChunk([tokens[r]], start, self.pages(r)) for r in range(batch)]
            tokens = self.forward(chunks).argmax(dim=-1).tolist()
        return time.thread_time() - started


def main() -> None:
    args = parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    bench = Bench(args, max(batches))
    rows = []
    for batch in batches:
        bench.prefill(batch)
        timings = {}
        for name, context in (
            ("per-sequence loop", per_sequence),
            ("batched", contextlib.nullcontext),
        ):
            with context():
                bench.decode(batch)  # warm-up
                timings[name] = statistics.median(bench.decode(batch) for _ in range(args.repeats))
        loop, batched = timings["per-sequence loop"], timings["batched"]
        tokens = batch * args.steps
        rows.append([batch, tokens / loop, tokens / batched, loop / batched])
    print_table(
        f"hybrid-small decode on CPU (1 thread, CPU time), {args.steps} steps after "
        f"{args.prompt}-token prompts",
        ["batch", "per-sequence loop tok/s", "batched tok/s", "speed-up"],
        rows,
    )


if __name__ == "__main__":
    main()
