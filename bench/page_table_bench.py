"""Host time of a decode step's page tables: rebuilt from every sequence's whole tables (the
old path) vs the persistent device tables updated from the kvstore's changes, same run.

    .venv/bin/python bench/page_table_bench.py                   # 8b@64 and 1b@256, pool 4,600
    .venv/bin/python bench/page_table_bench.py --shapes 8b:64:4600 --steps 256 --device cuda

Two kvstore managers take the same calls (a decode step of the whole batch: `allocate_all`,
then a commit per sequence): one as before, one watched (its delta record on). Each step's
chunks then go through the static decode buffers' loading (`DecodeRunner._load`): the old
runner reads each chunk's page ids from the manager (whole tables) and lays them in; the new
one takes the manager's changes, writes them into its tables and gathers the batch's rows.
The pool is filled the way the H200 runs fill it (contexts of pool / batch pages each, page
128, tables as wide as a 131,072-token context); a sequence crosses a page every 128 steps, at
staggered steps. Times are wall, best of the rounds (the machine may be shared).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import import_engine, print_table

import_engine()

from kvfleet.kvstore.config import KVStoreConfig  # noqa: E402
from kvfleet.kvstore.life_cycles import FullLifeCycle  # noqa: E402
from kvfleet.kvstore.manager import KVCacheManager  # noqa: E402
from kvfleet.kvstore.policies import PerRequest  # noqa: E402
from kvfleet.services.engine.compute.cuda_graphs import DecodeRunner  # noqa: E402
from kvfleet.services.engine.config.model_config import ModelConfig  # noqa: E402
from kvfleet.services.engine.kv.kv_cache import PagedKVCache  # noqa: E402
from kvfleet.services.engine.request.scheduled_chunk import ScheduledChunk  # noqa: E402

MAX_POSITION = 131072  # the 1b and 8b presets' context: tables 1,024 pages wide at page 128


def table_shape() -> ModelConfig:
    """One attention group, as the 1b/8b presets have; the smallest K/V (only ids matter)."""
    return ModelConfig(
        vocab_size=64,
        hidden_size=8,
        intermediate_size=8,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=8,
        max_position=MAX_POSITION,
        name="table-shape",
    )


class Side:
    """One manager and its decode runner, old path or persistent."""

    def __init__(self, persistent: bool, cache: PagedKVCache, batch: int, pool: int, page: int):
        config = KVStoreConfig(
            block_size=page,
            life_cycles=(FullLifeCycle("full"),),
            pool_pages={"full": pool},
            reuse_policy=PerRequest(),
        )
        self.manager = KVCacheManager(config)
        self.runner = DecodeRunner(None, cache, None, batch, capture=False)
        if persistent:
            self.runner.follow(self.manager.watch_page_tables())
        self.keys: list[str] = []

    def admit(self, key: str, prompt: list[int]) -> None:
        self.manager.add_request(key, prompt)
        self.manager.admit(key, len(prompt))
        self.manager.commit(key, len(prompt))
        self.manager.finish_context(key)
        self.keys.append(key)

    def plan(self) -> list[int]:
        """A decode step's kvstore calls; each sequence's start."""
        starts = self.manager.computed_tokens(self.keys)
        self.manager.allocate_all(self.keys, 1)
        return starts

    def commit(self, starts: list[int]) -> None:
        for key, start in zip(self.keys, starts, strict=True):
            self.manager.commit(key, start + 1)

    def chunks(self, starts: list[int]) -> list[ScheduledChunk]:
        """The step's chunks as the scheduler makes them (page ids read when first asked)."""
        return [
            ScheduledChunk(SimpleNamespace(key=key), start, (1,), partial(self._pages, key))
            for key, start in zip(self.keys, starts, strict=True)
        ]

    def _pages(self, key: str) -> dict[str, tuple[int, ...]]:
        return {name: self.manager.page_table(key, name) for name in self.manager.life_cycles}


def run_shape(batch: int, pool: int, page: int, steps: int, rounds: int, device: str):
    cache = PagedKVCache(table_shape(), pool, page, device)
    old, new = (Side(persistent, cache, batch, pool, page) for persistent in (False, True))
    rng = random.Random(0)
    # Fill the pool: each sequence's context is its share of pages, less the timed steps.
    context = ((pool - 1) // batch) * page - steps * rounds - page
    for i in range(batch):
        prompt = [rng.randrange(50_000) for _ in range(context - rng.randrange(page))]
        for side in (old, new):
            side.admit(f"r{i}", prompt)
    padded = old.runner.bucket(batch)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for side in (old, new):  # warm: one step each, and the new side's first (whole) tables
        side.runner._load(side.chunks(side.plan()), padded)
    best: dict[str, float] = {}
    for _ in range(rounds):
        totals = dict.fromkeys(("old plan", "new plan", "old tables", "new tables"), 0.0)
        for _ in range(steps):
            for name, side in (("old", old), ("new", new)):
                begin = time.perf_counter()
                starts = side.plan()
                side.commit(starts)
                planned = time.perf_counter()
                chunks = side.chunks(starts)
                loading = time.perf_counter()
                side.runner._load(chunks, padded)
                sync()
                totals[f"{name} plan"] += planned - begin
                totals[f"{name} tables"] += time.perf_counter() - loading
        for key, value in totals.items():
            best[key] = min(best.get(key, value), value)
    used = sum(pool_.num_in_use for pool_ in new.manager.pools.values())
    return {key: value / steps for key, value in best.items()}, used, context


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8b:64:4600,1b:256:4600", help="name:batch:pool,...")
    parser.add_argument("--page-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=128, help="steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="the quickest round counts")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for shape in args.shapes.split(","):
        name, batch, pool = shape.split(":")
        times, used, context = run_shape(
            int(batch), int(pool), args.page_size, args.steps, args.rounds, args.device
        )
        old_us, new_us = times["old tables"] * 1e6, times["new tables"] * 1e6
        rows.append([
            name, batch, f"{used}/{pool}", context,
            old_us, new_us, old_us / max(new_us, 1e-9),
            times["old plan"] * 1e6, times["new plan"] * 1e6,
        ])  # fmt: skip
    print_table(
        f"static decode buffers (tables included), us of host time per step (page {args.page_size}"
        f", {args.device}, best of {args.rounds} x {args.steps} steps)",
        [
            "shape", "batch", "pool pages used", "ctx",
            "buffers: rebuild", "buffers: persistent", "speed-up",
            "kvstore calls: before", "kvstore calls: watched",
        ],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
