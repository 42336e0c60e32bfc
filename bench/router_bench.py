"""Router admission benchmark: two router replicas on one Redis, strict vs lenient.

Each replica is an AdmissionQueue with its own Redis connection in its own thread (the same core
the router service runs), fed a saturated multi-turn workload: conversations return to their pin,
admitted requests finish a few passes later. Prints decisions/s, p50/p99 admission latency,
Redis round trips per admitted request, and ratios against lenient affinity in the same run.

    .venv/bin/python bench/router_bench.py [--seconds 3] [--redis-url redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field

import redis
from kvfleet.services.router.admission import AdmissionConfig, AdmissionQueue
from kvfleet.services.router.model import PendingRequest, Placement, RankInfo
from kvfleet.services.router.redis_store import RedisStore
from kvfleet.services.router.store import LocalStore

RANKS = 8
SLOTS = 8
CONVERSATIONS = 400
WAITING = 24  # requests kept waiting per replica


@dataclass
class ReplicaStats:
    latencies: list[float] = field(default_factory=list)
    admitted: int = 0
    decisions: int = 0
    deferrals: int = 0
    pinned: int = 0
    fallbacks: int = 0
    round_trips: int = 0


class CountingClient:
    """Counts Redis round trips of one client (commands, scripts and pipelines)."""

    def __init__(self, client: redis.Redis) -> None:
        self.count = 0
        inner = client.execute_command

        def counted(*args, **kwargs):
            self.count += 1
            return inner(*args, **kwargs)

        client.execute_command = counted
        original_pipeline = client.pipeline

        def pipeline(*args, **kwargs):
            pipe = original_pipeline(*args, **kwargs)
            inner_execute = pipe.execute

            def execute(*a, **k):
                self.count += 1
                return inner_execute(*a, **k)

            pipe.execute = execute
            return pipe

        client.pipeline = pipeline


def run_replica(
    queue: AdmissionQueue,
    seed: int,
    seconds: float,
    stats: ReplicaStats,
    counter: CountingClient | None,
    start: threading.Barrier,
) -> None:
    rng = random.Random(seed)
    running: list[tuple[int, str, str]] = []  # (finish at pass, rank, request)
    serial = 0
    start.wait()
    deadline = time.perf_counter() + seconds
    passes = 0
    while time.perf_counter() < deadline:
        while len(queue) < WAITING:
            serial += 1
            conv = f"c{rng.randrange(CONVERSATIONS)}"
            queue.enqueue(PendingRequest(f"{seed}-{serial}", conv, time.perf_counter()))
        passes += 1
        for item in [r for r in running if r[0] <= passes]:
            running.remove(item)
            queue.store.release(item[1], item[2])
        before = counter.count if counter else 0
        result = queue.run_pass()
        now = time.perf_counter()
        for admission in result.admitted:
            stats.latencies.append(now - admission.request.enqueued_at)
            running.append(
                (passes + rng.randint(1, 6), admission.rank.rank_id, admission.request.request_id)
            )
        stats.admitted += len(result.admitted)
        stats.decisions += len(result.admitted) + result.deferrals
        stats.deferrals += result.deferrals
        stats.pinned += result.count(Placement.PINNED)
        stats.fallbacks += result.count(Placement.FALLBACK)
        if counter:
            stats.round_trips += counter.count - before
    for _, rank_id, request_id in running:
        queue.store.release(rank_id, request_id)


def measure(affinity: str, store_kind: str, url: str, seconds: float) -> dict:
    prefix = f"bench-router-{uuid.uuid4().hex[:8]}"
    config = AdmissionConfig(affinity=affinity, max_wait_passes=4, max_wait_seconds=0.5)
    shared_local = LocalStore()
    queues, counters, clients = [], [], []
    for replica in range(2):
        if store_kind == "redis":
            client = redis.Redis.from_url(url, decode_responses=True)
            counters.append(CountingClient(client))
            clients.append(client)
            store = RedisStore(client, prefix, owner=f"router{replica}")
        else:
            counters.append(None)
            store = shared_local
        queues.append(AdmissionQueue(store, config, time.perf_counter))
    for rank in range(RANKS):
        queues[0].store.register_rank(RankInfo(f"r{rank}", f"r{rank}:1", SLOTS), time.time())
    stats = [ReplicaStats(), ReplicaStats()]
    lock_free = store_kind == "redis"
    barrier = threading.Barrier(2)
    if lock_free:
        threads = [
            threading.Thread(
                target=run_replica, args=(queues[i], i, seconds, stats[i], counters[i], barrier)
            )
            for i in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:  # the in-process store has one writer: replicas take turns in one thread
        single = threading.Barrier(1)
        run_replica(queues[0], 0, seconds, stats[0], None, single)
    queues[0].store.check_integrity()
    if store_kind == "redis":
        queues[0].store.clear()
        for client in clients:
            client.close()
    latencies = sorted(x for s in stats for x in s.latencies)
    admitted = sum(s.admitted for s in stats)
    return {
        "affinity": affinity,
        "store": store_kind + (" x2" if lock_free else " x1"),
        "decisions_s": sum(s.decisions for s in stats) / seconds,
        "admitted_s": admitted / seconds,
        "p50_ms": statistics.median(latencies) * 1000 if latencies else float("nan"),
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1000 if latencies else float("nan"),
        "rtt_per_admit": sum(s.round_trips for s in stats) / admitted if lock_free else 0.0,
        "pinned_pct": 100 * sum(s.pinned for s in stats) / max(1, admitted),
        "fallback_pct": 100 * sum(s.fallbacks for s in stats) / max(1, admitted),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    rows = [
        measure("lenient", "redis", args.redis_url, args.seconds),
        measure("strict", "redis", args.redis_url, args.seconds),
        measure("lenient", "local", args.redis_url, args.seconds),
        measure("strict", "local", args.redis_url, args.seconds),
    ]
    baseline = rows[0]
    print(
        f"{RANKS} ranks x {SLOTS} slots, {CONVERSATIONS} conversations, "
        f"{args.seconds:g} s per row; ratios vs lenient on redis x2"
    )
    header = (
        f"{'affinity':8} {'store':9} {'decisions/s':>11} {'admitted/s':>10} {'ratio':>6} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'rtt/admit':>9} {'pinned %':>8} {'fallback %':>10}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = row["admitted_s"] / baseline["admitted_s"]
        print(
            f"{row['affinity']:8} {row['store']:9} {row['decisions_s']:11.0f} "
            f"{row['admitted_s']:10.0f} {ratio:6.2f} {row['p50_ms']:7.2f} {row['p99_ms']:7.2f} "
            f"{row['rtt_per_admit']:9.2f} {row['pinned_pct']:8.1f} {row['fallback_pct']:10.1f}"
        )


if __name__ == "__main__":
    main()
