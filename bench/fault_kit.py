"""Processes and load for the fault matrix: redis-server, `kvfleet router`, `kvfleet engine`.

Everything listens on 127.0.0.1, is started here and stopped here by its own pid. The load is
real gRPC clients; each request ends in one outcome: succeeded (stream finished), failed
cleanly (a status other than DEADLINE_EXCEEDED), hung (the client's deadline ran out, or no
deadline and no end), wrong (finished but not what was asked, or a good request hurt by a bad
one).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import redis
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc

HOST = "127.0.0.1"
SECRET = secrets.token_hex(16)
START_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until true; returns the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - start


@dataclass
class Processes:
    """Every process of the run; `stop_all` ends each by pid."""

    workdir: Path
    started: list[subprocess.Popen] = field(default_factory=list)

    def spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "KVFLEET_FLEET_SECRET": SECRET}
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.started.append(process)
        return process

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.terminate()
        for process in self.started:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


class RedisProcess:
    def __init__(self, procs: Processes) -> None:
        self.procs, self.port = procs, free_port()
        self.url = f"redis://{HOST}:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no"]
        self.process = self.procs.spawn("redis", ["redis-server", *args])
        client = redis.Redis(port=self.port, socket_timeout=1)
        wait_for(lambda: _pings(client), 20, "redis up")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@dataclass
class RouterProcess:
    process: subprocess.Popen
    port: int
    rank_port: int
    metrics_port: int
    http_port: int

    def rss_mib(self) -> float:
        """The router process's resident memory now, MiB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1)) / 1024

    def metric(self, name: str) -> float:
        url = f"http://{HOST}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as page:
            text = page.read().decode()
        match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0


def start_router(
    procs: Processes, name: str, redis_url: str, *extra: str, rank_port: int | None = None
) -> RouterProcess:
    """`rank_port`: one chosen before (ranks started earlier already name it)."""
    port, metrics_port, http_port = (free_port() for _ in range(3))
    rank_port = rank_port or free_port()
    command = [sys.executable, "-m", "kvfleet.services.cli", "router", "--host", HOST,
               "--grpc-port", str(port), "--rank-port", str(rank_port),
               "--metrics-port", str(metrics_port), "--http-port", str(http_port),
               "--redis-url", redis_url,
               "--redis-prefix", "faults", "--replica-id", name, *extra]  # fmt: skip
    process = procs.spawn(name, command)
    wait_for(lambda: "http port" in procs.log(name), START_TIMEOUT_S, f"{name} up")
    return RouterProcess(process, port, rank_port, metrics_port, http_port)


def start_rank(procs: Processes, rank_id: str, *rank_ports: int) -> subprocess.Popen:
    """A tiny-model rank registering with the routers on `rank_ports`, tried in turn."""
    routers = ",".join(f"{HOST}:{port}" for port in rank_ports)
    command = [sys.executable, "-m", "kvfleet.services.cli", "engine", "--model", "tiny",
               "--host", HOST, "--advertise-host", HOST, "--grpc-port", str(free_port()),
               "--http-port", "-1", "--metrics-port", "-1", "--rank-id", rank_id,
               "--max-batch-size", "4", "--kv-pages", "96", "--podinfo-dir", str(procs.workdir),
               "--router", routers]  # fmt: skip
    return procs.spawn(rank_id, command)


@dataclass
class Counts:
    sent: int = 0
    succeeded: int = 0
    failed_cleanly: int = 0
    hung: int = 0
    wrong: int = 0
    seconds: float = 0.0
    codes: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str, code: str = "") -> None:
        with self._lock:
            setattr(self, outcome, getattr(self, outcome) + 1)
            if code:
                self.codes[code] = self.codes.get(code, 0) + 1


@dataclass(frozen=True)
class Turn:
    conversation: str
    max_tokens: int = 4
    temperature: float = 0.0
    top_p: float = 1.0
    bad: bool = False  # a request that may fail alone; a good one must not fail with it


def send(stub, turn: Turn, deadline: float | None, counts: Counts) -> None:
    request = router_pb2.GenerateRequest(
        conversation_id=turn.conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3, 4]),
        sampling=common_pb2.SamplingParams(temperature=turn.temperature, top_p=turn.top_p),
        max_tokens=turn.max_tokens,
    )
    try:
        tokens = [t for r in stub.Generate(request, timeout=deadline) for t in r.chunk.token_ids]
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            counts.add("hung", error.code().name)
        elif turn.bad or error.code() == grpc.StatusCode.UNAVAILABLE:
            counts.add("failed_cleanly", error.code().name)
        else:  # a good request failing for a reason other than a lost rank
            counts.add("wrong", error.code().name)
        return
    counts.add("succeeded" if len(tokens) == turn.max_tokens else "wrong")


def run_load(
    port: int,
    turns: list[Turn],
    concurrency: int,
    deadline: float | None,
    during: Callable[[], None] | None = None,
    hang_after: float = 60.0,
) -> Counts:
    """Send the turns from `concurrency` clients; `during` runs once the first are in flight.
    A request still open `hang_after` s after the last was sent counts as hung."""
    counts = Counts(sent=len(turns))
    channel = grpc.insecure_channel(f"{HOST}:{port}")
    stub = router_pb2_grpc.RouterStub(channel)
    gate = threading.Semaphore(concurrency)

    def one(turn: Turn) -> None:
        try:
            send(stub, turn, deadline, counts)
        finally:
            gate.release()

    start = time.monotonic()
    workers = []
    for i, turn in enumerate(turns):
        gate.acquire()
        worker = threading.Thread(target=one, args=(turn,), daemon=True)  # a hung one is left
        worker.start()
        workers.append(worker)
        if i == min(concurrency, len(turns)) - 1 and during is not None:
            during()
    finish_by = time.monotonic() + hang_after
    for worker in workers:
        worker.join(timeout=max(0.0, finish_by - time.monotonic()))
        if worker.is_alive():
            counts.add("hung")
    counts.seconds = time.monotonic() - start
    channel.close()
    return counts
