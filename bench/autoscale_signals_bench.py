"""What the autoscaling contract costs the router: draining-aware placement and the TTFT p90 gauge.

1. Admission passes on the in-process store (64 ranks x 8 slots, a queue of new conversations),
   with no rank draining (baseline) and with a quarter of the ranks draining: passes/s, ratio,
   and the share of placements that landed on a draining rank (must be 0).
2. One scrape of the router's /metrics page with the TTFT window holding N values, against the
   same page with an empty window (baseline): microseconds per scrape and ratio.

    .venv/bin/python bench/autoscale_signals_bench.py [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import random
import time

from kvfleet.services.router.admission import AdmissionConfig, AdmissionQueue
from kvfleet.services.router.metrics import RouterMetrics
from kvfleet.services.router.model import PendingRequest, RankInfo, RankLoad
from kvfleet.services.router.store import LocalStore
from prometheus_client import generate_latest

RANKS = 64
SLOTS = 8
WAITING = 256


def admission_run(draining: int, seconds: float) -> tuple[float, float]:
    """Passes/s, and the share of admissions placed on draining ranks."""
    store = LocalStore()
    clock = time.monotonic
    for i in range(RANKS):
        store.register_rank(RankInfo(f"r{i:02d}", f"r{i}:1", SLOTS), clock())
        store.heartbeat(f"r{i:02d}", RankLoad(SLOTS, 0, 0.0, i < draining), clock())
    queue = AdmissionQueue(store, AdmissionConfig(), clock)
    rng = random.Random(7)
    passes = admitted = on_draining = serial = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        while len(queue) < WAITING:
            serial += 1
            queue.enqueue(PendingRequest(f"q{serial}", f"c{serial}", clock()))
        result = queue.run_pass()
        passes += 1
        for admission in result.admitted:
            admitted += 1
            rank_id = admission.rank.rank_id
            on_draining += int(rank_id[1:]) < draining
            if rng.random() < 0.9:  # most finish before the next pass: keep the fleet saturated
                store.release(rank_id, admission.request.request_id)
    return passes / seconds, on_draining / max(1, admitted)


def scrape_run(values: int, seconds: float) -> float:
    """Microseconds per /metrics page with `values` TTFT observations in the window."""
    metrics = RouterMetrics()
    rng = random.Random(11)
    for _ in range(values):
        metrics.observe_ttft(rng.expovariate(2.0))
    scrapes = 0
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        generate_latest(metrics.registry)
        scrapes += 1
    return (time.perf_counter() - started) / scrapes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per row")
    args = parser.parse_args()

    print(f"admission passes, {RANKS} ranks x {SLOTS} slots, {WAITING} waiting new conversations")
    print(f"{'draining ranks':>15} {'passes/s':>10} {'vs none':>8} {'placed on draining':>19}")
    base, _ = admission_run(0, args.seconds)
    for draining in (0, RANKS // 4):
        rate, share = admission_run(draining, args.seconds) if draining else (base, 0.0)
        print(f"{draining:>15} {rate:>10.1f} {rate / base:>8.2f} {share:>18.1%}")

    print("\nrouter /metrics scrape with the TTFT p90 window holding N values (last minute)")
    print(f"{'N':>8} {'us/scrape':>10} {'vs empty':>9}")
    empty = scrape_run(0, args.seconds)
    for values in (0, 1_000, 10_000, 50_000):
        micros = scrape_run(values, args.seconds) if values else empty
        print(f"{values:>8} {micros:>10.0f} {micros / empty:>9.2f}")


if __name__ == "__main__":
    main()
