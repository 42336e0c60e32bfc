"""Fault matrix: real processes on loopback (redis-server, `kvfleet router`, three tiny-model
`kvfleet engine` ranks), one fault at a time under client load; per fault a row of what the
clients saw: sent, succeeded, failed cleanly, hung, wrong.

    .venv/bin/python bench/fault_matrix.py [--fast]

The router runs with its shipped settings (strict affinity, 10 s heartbeat timeout, 120 s
stream idle timeout); `--fast` shortens them (lenient affinity, 3 s timeouts) for a quicker run.
`ok/s` of a row is its requests finished per second; the baseline row is the same load with no
fault, measured in the same run. A few minutes on 2 cores.
"""

from __future__ import annotations

import signal
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import redis

sys.path.insert(0, str(Path(__file__).parent))  # the bench folder is not a package
from fault_kit import (
    HOST,
    SECRET,
    Counts,
    Processes,
    RedisProcess,
    Turn,
    free_port,
    run_load,
    start_rank,
    start_router,
    wait_for,
)
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.fleet_secret import secret_metadata
from kvfleet.services.router.redis_store import RedisStore

RANKS = ("rank-0", "rank-1", "rank-2")
FAST_FLAGS = (
    *("--heartbeat-timeout-seconds", "3", "--stream-idle-seconds", "3"),
    *("--lease-seconds", "3", "--redis-timeout-seconds", "1", "--affinity", "lenient"),
)
FAST = "--fast" in sys.argv[1:]
ROUTER_FLAGS = FAST_FLAGS if FAST else ()
HEARTBEAT_TIMEOUT_S = 3.0 if FAST else 10.0  # the router's --heartbeat-timeout-seconds
BIG_REGISTER_BYTES = 70 * 1024 * 1024
SLOW_CLIENTS = 50
DEADLINE = 30.0
HUNG_REPLICA_S = 25.0
ROWS: list[tuple[str, Counts, str]] = []


def turns(tag: str, count: int, **kwargs) -> list[Turn]:
    return [Turn(f"{tag}-{i}", **kwargs) for i in range(count)]


def row(name: str, counts: Counts, note: str = "") -> None:
    ROWS.append((name, counts, note))
    print(f"  {name}: {counts.succeeded}/{counts.sent} ok {note}", flush=True)


def ok_rate(counts: Counts) -> str:
    return f"{counts.succeeded / max(counts.seconds, 1e-9):.1f} ok/s"


def removed(router) -> float:
    return router.metric("kvfleet_router_ranks_removed_total")


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="kvfleet-faults-"))
    procs = Processes(workdir)
    start = time.monotonic()
    try:
        run(procs)
    finally:
        procs.stop_all()
    print_table()
    print(f"{time.monotonic() - start:.0f} s; logs: {workdir}")
    return 0


def run(procs: Processes) -> None:
    store = RedisProcess(procs)
    store.start()
    router = start_router(procs, "router-a", store.url, *ROUTER_FLAGS)
    b_rank_port = free_port()  # router-b starts later; the ranks know it from the start
    ranks = {
        rank_id: start_rank(procs, rank_id, router.rank_port, b_rank_port) for rank_id in RANKS
    }
    shared = RedisStore(redis.Redis(port=store.port, decode_responses=True), prefix="faults")
    wait_for(lambda: len(shared.snapshot()) == len(RANKS), 180, "ranks registered")
    run_load(router.port, turns("warm", 6), 6, DEADLINE)

    baseline = run_load(router.port, turns("base", 24), 6, DEADLINE)
    row("baseline (no fault)", baseline, ok_rate(baseline))

    no_deadline = run_load(router.port, turns("nodl", 6), 6, None, hang_after=30)
    row("client without a deadline", no_deadline)

    before = removed(router)
    mixed = turns("good", 12)
    for i in range(3):
        mixed.insert(4 * i, Turn(f"tiny-t-{i}", temperature=1e-40, bad=True))
        mixed.insert(4 * i + 2, Turn(f"tiny-p-{i}", temperature=1.0, top_p=1e-40, bad=True))
    sampler = run_load(router.port, mixed, 6, DEADLINE)
    row(
        "temperature / top_p = 1e-40 mixed in",
        sampler,
        f"ranks removed {removed(router) - before:g}; codes {sampler.codes}",
    )

    store.process.send_signal(signal.SIGSTOP)
    hung_redis = run_load(router.port, turns("hang", 60), 6, DEADLINE)
    store.process.send_signal(signal.SIGCONT)
    row("redis hung (SIGSTOP)", hung_redis, f"{ok_rate(hung_redis)} (baseline {ok_rate(baseline)})")

    before = removed(router)
    store.kill()
    outage = run_load(router.port, turns("out", 12), 6, DEADLINE)
    store.start()
    wait_for(lambda: router.metric("kvfleet_router_degraded") == 0, 30, "resync")
    after = run_load(router.port, turns("back", 12), 6, DEADLINE)
    outage.sent += after.sent
    for name in ("succeeded", "failed_cleanly", "hung", "wrong"):
        setattr(outage, name, getattr(outage, name) + getattr(after, name))
    time.sleep(HEARTBEAT_TIMEOUT_S + 1)  # past the resync: would silent ranks be swept?
    row("redis killed, restarted empty", outage, f"ranks removed {removed(router) - before:g}")

    def busy(rank_id: str) -> None:
        wait_for(lambda: shared.snapshot()[rank_id][0].used > 0, 30, f"{rank_id} busy")

    victim = ranks["rank-1"]

    def hang_rank() -> None:
        busy("rank-1")
        victim.send_signal(signal.SIGSTOP)

    hung_rank = run_load(router.port, turns("hungrank", 12, max_tokens=48), 6, DEADLINE, hang_rank)
    victim.send_signal(signal.SIGCONT)
    row("engine hung (SIGSTOP) mid-load", hung_rank, f"codes {hung_rank.codes}")
    wait_for(lambda: len(shared.snapshot()) == len(RANKS), 60, "hung rank back")

    def kill_rank() -> None:
        busy("rank-2")
        ranks["rank-2"].kill()

    killed = run_load(router.port, turns("killrank", 12, max_tokens=48), 6, DEADLINE, kill_rank)
    row("engine SIGKILL mid-stream", killed, f"codes {killed.codes}")

    replica = start_router(procs, "router-b", store.url, *ROUTER_FLAGS, rank_port=b_rank_port)
    two_replica_rows(procs, store, router, replica, ranks, shared)
    reclaimed = {}

    def kill_replica() -> None:
        wait_for(lambda: any(s.used for s, _ in shared.snapshot().values()), 30, "b reserved")
        replica.process.kill()
        reclaimed["s"] = wait_for(
            lambda: all(s.used == 0 for s, _ in shared.snapshot().values()), 60, "reaped"
        )

    via_b = run_load(replica.port, turns("viab", 4, max_tokens=400), 4, DEADLINE, kill_replica)
    row("router replica SIGKILL", via_b, f"its slots back in {reclaimed.get('s', -1):.1f} s")

    row("forged Register (no secret; live id)", forged_registers(router))
    live = shared.snapshot()["rank-0"][0].info
    row("re-Register of a live rank with 64 slots", resized_register(router, live))
    rss_before = router.rss_mib()
    big = unauthenticated_big_registers(router)
    rss = f"router RSS {rss_before:.0f} -> {router.rss_mib():.0f} MiB"
    row("8 x 70 MB Register without the secret", big, f"{rss}; codes {big.codes}")
    slow, seconds = slowloris(router.http_port)
    row(f"{SLOW_CLIENTS} half-sent HTTP requests (router front)", slow,
        f"all closed by the server after {seconds:.0f} s")  # fmt: skip
    after_faults = run_load(router.port, turns("after", 12), 6, DEADLINE)
    row("load after the rank-door faults", after_faults, ok_rate(after_faults))


def two_replica_rows(procs, store, router, replica, ranks, shared) -> None:
    """Faults of a fleet with two router replicas on one Redis: one hung, Redis emptied
    under both, a rank's SIGTERM drain."""
    live = len(shared.snapshot())  # rank-2 was killed above
    before = removed(replica)

    def hang_router_a() -> None:
        router.process.send_signal(signal.SIGSTOP)
        time.sleep(HUNG_REPLICA_S)
        router.process.send_signal(signal.SIGCONT)

    hung = run_load(replica.port, turns("hungrep", 12, max_tokens=48), 6, DEADLINE, hang_router_a)
    row(f"router replica hung {HUNG_REPLICA_S:g} s (SIGSTOP), load via the other", hung,
        f"ranks removed {removed(replica) - before:g}")  # fmt: skip
    wait_for(lambda: len(shared.snapshot()) == live, 60, "ranks after the hang")

    full_before = requeued_full(router) + requeued_full(replica)
    via_b: dict[str, Counts] = {}
    side = threading.Thread(
        target=lambda: via_b.update(c=run_load(replica.port, turns("emptyb", 12), 3, DEADLINE))
    )
    side.start()
    emptied = run_load(router.port, turns("emptya", 12), 3, DEADLINE, lambda: restart(store))
    side.join()
    for name in ("sent", "succeeded", "failed_cleanly", "hung", "wrong"):
        setattr(emptied, name, getattr(emptied, name) + getattr(via_b["c"], name))
    full = requeued_full(router) + requeued_full(replica) - full_before
    row("redis restarted empty under two replicas", emptied, f"engine refusals {full:g}")
    wait_for(lambda: len(shared.snapshot()) == live, 60, "ranks after the restart")

    conversations = [Turn(f"roll-{i % 6}", max_tokens=48) for i in range(36)]
    old_address = shared.snapshot()["rank-0"][0].info.address
    drained = run_load(router.port, conversations, 6, DEADLINE,
                       lambda: ranks["rank-0"].send_signal(signal.SIGTERM))  # fmt: skip
    row("rank SIGTERM drain under pinned load", drained, f"codes {drained.codes}")
    ranks["rank-0"].wait(60)
    ranks["rank-0"] = start_rank(procs, "rank-0", router.rank_port, replica.rank_port)

    def restarted() -> bool:  # the new process registered (the leaving one may still be listed)
        entry = shared.snapshot().get("rank-0")
        return entry is not None and entry[0].info.address != old_address

    wait_for(restarted, 180, "rank-0 back")


def restart(store: RedisProcess) -> None:
    """Redis stopped and started again empty (no persistence) under load."""
    store.kill()
    store.start()


def requeued_full(router) -> float:
    """Requests an engine turned away as full: the router had over-admitted it."""
    return router.metric("kvfleet_router_requeued_full_total")


def resized_register(router, live) -> Counts:
    """A live rank's registration again, but with 64 slots: must be refused, not applied."""
    counts = Counts(sent=1)
    request = router_pb2.RegisterRequest(
        rank_id=live.rank_id, address=live.address, max_batch_size=64,
        role=common_pb2.RANK_ROLE_BOTH, block_size=live.block_size,
    )  # fmt: skip
    with grpc.insecure_channel(f"{HOST}:{router.rank_port}") as channel:
        try:
            router_pb2_grpc.RankRegistryStub(channel).Register(
                request, timeout=10, metadata=secret_metadata(SECRET)
            )
            counts.add("wrong")  # the router would overfill the rank
        except grpc.RpcError as error:
            counts.add("failed_cleanly", error.code().name)
    return counts


def unauthenticated_big_registers(router) -> Counts:
    """Eight 70 MB Register calls at once, without the fleet secret."""
    counts = Counts(sent=8)
    options = (("grpc.max_send_message_length", 2 * BIG_REGISTER_BYTES),)
    forged = router_pb2.RegisterRequest(
        rank_id="intruder", address="x" * BIG_REGISTER_BYTES, max_batch_size=4
    )
    with grpc.insecure_channel(f"{HOST}:{router.rank_port}", options=options) as channel:
        registry = router_pb2_grpc.RankRegistryStub(channel)

        def one(_index: int) -> None:
            try:
                registry.Register(forged, timeout=60)
                counts.add("wrong")
            except grpc.RpcError as error:
                outcome = "hung" if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED else None
                counts.add(outcome or "failed_cleanly", error.code().name)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(8)))
    return counts


def slowloris(http_port: int, bound_s: float = 90.0) -> tuple[Counts, float]:
    """Connections that send half a request head and go quiet; failed cleanly: closed by the
    server within `bound_s`, hung: still open then."""
    counts = Counts(sent=SLOW_CLIENTS)
    start = time.monotonic()
    sockets = []
    for _ in range(SLOW_CLIENTS):
        sock = socket.create_connection((HOST, http_port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        sockets.append(sock)

    def wait_closed(sock: socket.socket) -> None:
        sock.settimeout(max(0.1, bound_s - (time.monotonic() - start)))
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
        counts.add("failed_cleanly" if closed else "hung")
        sock.close()

    threads = [threading.Thread(target=wait_closed, args=(s,)) for s in sockets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts, time.monotonic() - start


def forged_registers(router) -> Counts:
    """Two attempts to point a live rank at a fake address; each must be refused."""
    counts = Counts(sent=2)
    forged = router_pb2.RegisterRequest(rank_id="rank-0", address=f"{HOST}:9", max_batch_size=4)
    with grpc.insecure_channel(f"{HOST}:{router.rank_port}") as channel:
        registry = router_pb2_grpc.RankRegistryStub(channel)
        for metadata in ((), secret_metadata(SECRET)):
            try:
                registry.Register(forged, timeout=10, metadata=metadata)
                counts.add("wrong")  # accepted: the rank's traffic would go to the forger
            except grpc.RpcError as error:
                counts.add("failed_cleanly", error.code().name)
    return counts


def print_table() -> None:
    header = ("fault", "sent", "succeeded", "failed cleanly", "hung", "wrong", "note")
    lines = [header] + [
        (name, c.sent, c.succeeded, c.failed_cleanly, c.hung, c.wrong, note)
        for name, c, note in ROWS
    ]
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for line in lines[1:]:
        print("| " + " | ".join(str(cell) for cell in line) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
