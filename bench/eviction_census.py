"""What fills a rank's GPU and host when a block that rank reads again leaves both.

Replays twice (the simulated replay is deterministic; `sim_loss_bench.py`'s arguments). The
first run records, per rank and block, when a prompt admitted there first reads it (a count
of first admissions). The second samples every `--every`-th eviction from GPU and host of a
block the rank reads again later, and counts the rank's GPU pages (held by its running
requests, taken by the step in flight, evictable and by which call, retained) and host blocks,
each as read again later on that rank or never; and, of the evictable ones, those read again
only after the evicted block (an order that knew the future would evict them first).

Run: nice -n 10 .venv/bin/python bench/eviction_census.py --files <12 files> --max-turns 24 \
       --max-tokens 64 --time-scale 0 --stagger 1 --ranks 4 --slots 2 \
       --retained-conversations 2 --model bench/gpu/sim_1b_h200_shared.yaml \
       --set block_size=16,gpu_gib=6.6995,host_gib=3.3497
"""

from __future__ import annotations

import asyncio
import bisect
import sys
from collections import Counter, defaultdict
from typing import Any

import sim_loss_bench
from loss_tracer import LossTracer
from rich.console import Console
from rich.table import Table


class Census:
    """One replay's first admissions per (rank, block) and, given the first run's, samples."""

    def __init__(self, future: dict | None, every: int) -> None:
        self.future = future  # (rank, block) -> sorted admission counts (the first run's)
        self.every = every
        self.admissions = 0
        self.reads: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.needed_evictions = 0
        self.evictions = 0
        self.samples: list[Counter] = []

    def attach(self, target: Any, tracer: LossTracer) -> None:
        for rank_id, rank in target.fleet.ranks.items():
            self._wrap(rank_id, rank, tracer)

    def next_read(self, rank_id: str, block_hash: int | None) -> int | None:
        """Admissions until the rank next reads the block (None: never again)."""
        reads = (self.future or {}).get((rank_id, block_hash), [])
        index = bisect.bisect_right(reads, self.admissions)
        return reads[index] - self.admissions if index < len(reads) else None

    def _wrap(self, rank_id: str, rank: Any, tracer: LossTracer) -> None:
        manager, seen = rank.manager, set()
        admit, host = manager.admit, manager.tiers.host
        insert = host.insert

        def first_admit(request_id: str, num_new_tokens: int):
            state = manager._state(request_id)
            if request_id not in seen and state.conversation_id is not None:  # not a hold
                seen.add(request_id)
                self.admissions += 1
                for block_hash in state.sequence.hashes:
                    self.reads[(rank_id, block_hash)].append(self.admissions)
            return admit(request_id, num_new_tokens)

        def host_insert(life_cycle: str, block_hash: int, *rest):
            slot, evicted = insert(life_cycle, block_hash, *rest)
            for old, _ in evicted:
                if manager.pools[life_cycle].lookup(old) is not None:
                    continue  # still on the GPU: nothing lost
                self.evictions += 1
                wait = self.next_read(rank_id, old)
                if wait is None:
                    continue
                self.needed_evictions += 1
                if self.needed_evictions % self.every == 0:
                    self.samples.append(self._count(rank_id, rank, life_cycle, wait, tracer))
            return slot, evicted

        manager.admit, host.insert = first_admit, host_insert

    def _count(self, rank_id: str, rank: Any, name: str, wait: int, tracer: LossTracer):
        manager = rank.manager
        pool, host = manager.pools[name], manager.tiers.host
        in_tables = {p for s in manager._requests.values() for p in s.page_tables.get(name, ())}
        retained = {
            page
            for turns in manager._conversations.all_turns()
            for record in turns.in_order()
            for page in record.pages.get(name, ())
        }
        counts: Counter = Counter()

        def count(where: str, block_hash: int | None, evictable: bool) -> None:
            later = self.next_read(rank_id, block_hash) if block_hash is not None else None
            counts[(where, "read again" if later is not None else "never")] += 1
            if evictable:
                order = "never" if later is None else "after" if later > wait else "before"
                counts[("evictable, read again vs the evicted block", order)] += 1

        for page in range(1, pool.num_pages):
            block_hash = pool.page_hash(page)
            if pool.ref_count(page) == 0:
                if block_hash is not None:
                    how = tracer._made_evictable.get((rank_id, name, block_hash), "?")
                    count(f"GPU evictable ({how})", block_hash, True)
            elif page in in_tables:
                count("GPU held by a request", block_hash, False)
            elif page in retained:
                count("GPU retained", block_hash, False)
            else:
                count("GPU taken by the step in flight", block_hash, False)
        for block_hash in host.hashes(name):
            count("host", block_hash, True)
        return counts


async def replay(args, census: Census) -> None:
    def attach(tracers: list[LossTracer]):
        def each(target):
            tracer = LossTracer(target)
            tracers.append(tracer)
            census.attach(target, tracer)

        return each

    sim_loss_bench.tracers_of = attach
    await sim_loss_bench.run(args)


def main() -> None:
    every = 97
    if "--every" in sys.argv:
        at = sys.argv.index("--every")
        every = int(sys.argv[at + 1])
        del sys.argv[at : at + 2]
    args = sim_loss_bench.parse_args()
    first = Census(None, every)
    asyncio.run(replay(args, first))
    census = Census(dict(first.reads), every)
    asyncio.run(replay(args, census))
    total: Counter = Counter()
    for sample in census.samples:
        total.update(sample)
    n = max(1, len(census.samples))
    title = (
        f"{census.needed_evictions} of {census.evictions} evictions from GPU and host were of a "
        f"block its rank reads again; {len(census.samples)} sampled, mean pages per sample"
    )
    table = Table(title=title)
    for column in ("where", "read again later", "never read again on the rank"):
        table.add_column(column, justify="right")
    for where in sorted({where for where, _ in total}):
        if where.startswith("evictable"):
            continue
        again, never = total[(where, "read again")], total[(where, "never")]
        table.add_row(where, f"{again / n:.0f}", f"{never / n:.0f}")
    key = "evictable, read again vs the evicted block"
    table.add_row(
        "evictable (GPU + host): read again after the evicted block / never",
        f"{total[(key, 'after')] / n:.0f}",
        f"{total[(key, 'never')] / n:.0f}",
    )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
