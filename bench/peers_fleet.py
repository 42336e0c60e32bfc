"""Processes of one peers-bench arm: sim-backend engine ranks and the router in front of them.

Every process listens on 127.0.0.1 only, is started here and stopped here by its own pid.
The routers' command lines are a small registry (`ROUTERS`): kvfleet's own router, sglang-router
and vllm-router, each with a policy.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

HOST = "127.0.0.1"
BIN = Path(sys.executable).parent
# Where console scripts may be: this interpreter's bin, then the bin of every virtual
# environment on sys.path (a worktree's .venv reaches the shared one's packages through a .pth).
SCRIPT_DIRS = (BIN, *(Path(p).parents[2] / "bin" for p in sys.path if p.endswith("site-packages")))


def script(name: str) -> Path:
    """The console script `name` from the first of SCRIPT_DIRS that has it (else BIN/name)."""
    found = shutil.which(name, path=os.pathsep.join(str(d) for d in SCRIPT_DIRS))
    return Path(found) if found else BIN / name


START_TIMEOUT_S = 60.0
TEXT_SCHEME = "text+http://"  # a router replayed with `--api text` (it takes no token ids)
FLEET_SECRET = secrets.token_hex(16)
SERVED_MODEL = "tiny"  # the ranks' model name, which their OpenAI endpoints check


def free_port() -> int:
    """A port that was free on loopback a moment ago."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class RankSettings:
    """What every sim rank of the bench runs with (the engine.yaml it is given)."""

    model_dir: Path
    max_batch_size: int
    kv_pages: int
    page_size: int = 64
    max_num_batched_tokens: int = 8192
    sim_time_scale: float = 1.0
    reuse_policy: str = "per_conversation"
    max_num_turns: int = 5  # the engine's default

    def engine_yaml(self) -> dict:
        return {
            "model": {"name": SERVED_MODEL, "path": str(self.model_dir)},
            "max_batch_size": self.max_batch_size,
            "reuse": {"policy": self.reuse_policy, "max_num_turns": self.max_num_turns},
            "engine": {
                "page_size": self.page_size,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "kv_pages": self.kv_pages,
                "compute_backend": "sim",
                "sim_time_scale": self.sim_time_scale,
                "checkpoint_margin_tokens": 512,
            },
        }


@dataclass
class Fleet:
    """The processes of one arm; `stop` ends each by pid."""

    workdir: Path
    processes: list[subprocess.Popen] = field(default_factory=list)
    rank_urls: list[str] = field(default_factory=list)
    rank_grpc: list[str] = field(default_factory=list)

    def spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
        env["KVFLEET_FLEET_SECRET"] = FLEET_SECRET  # the router's rank port asks for it
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.processes.append(process)
        return process

    def start_ranks(self, settings: RankSettings, count: int, router: str | None = None) -> None:
        """`count` sim ranks; with `router`, each registers with kvfleet's router there."""
        config = self.workdir / "engine.yaml"
        config.write_text(yaml.safe_dump(settings.engine_yaml()))
        for index in range(count):
            http, grpc = free_port(), free_port()
            command = [
                str(BIN / "kvfleet"),
                "engine",
                "--config",
                str(config),
                "--host",
                HOST,
                "--grpc-port",
                str(grpc),
                "--http-port",
                str(http),
                "--metrics-port",
                "-1",
                "--rank-id",
                f"peers-rank-{index}",
                "--podinfo-dir",
                str(self.workdir),
            ]
            if router:
                command += ["--router", router, "--advertise-host", HOST]
            self.spawn(f"rank-{index}", command)
            self.rank_urls.append(f"http://{HOST}:{http}")
            self.rank_grpc.append(f"{HOST}:{grpc}")
        for url in self.rank_urls:
            wait_http(f"{url}/health", self)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM each process by pid, then SIGKILL any that did not exit."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self.processes.clear()

    def check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(
                    f"{process.args[:3]} exited with {process.returncode}; logs in {self.workdir}"
                )


def metrics_flags() -> list[str]:
    """A peer router's Prometheus listener: on loopback, off its fixed default port."""
    return ["--prometheus-host", HOST, "--prometheus-port", str(free_port())]


def wait_http(url: str, fleet: Fleet, timeout: float = START_TIMEOUT_S) -> None:
    """Poll `url` until it answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.check_alive()
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout} s; logs in {fleet.workdir}")


def wait_log(path: Path, text: str, count: int, fleet: Fleet, timeout: float = START_TIMEOUT_S):
    """Wait until `text` appears `count` times in the log at `path`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.check_alive()
        if path.exists() and path.read_text(errors="replace").count(text) >= count:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{text!r} x{count} not in {path} within {timeout} s")


# -- routers: (fleet, settings, ranks, policy) -> replay target spec ---------------------------


def kvfleet_router(fleet: Fleet, settings: RankSettings, ranks: int, policy: str) -> str:
    """kvfleet's router (in-process pins), ranks registered with it; replayed over grpc://."""
    port, rank_port = free_port(), free_port()
    command = [
        str(BIN / "kvfleet"),
        "router",
        "--host",
        HOST,
        "--grpc-port",
        str(port),
        "--rank-port",
        str(rank_port),
        "--metrics-port",
        "-1",
        "--http-port",
        "-1",
        "--affinity",
        policy,
    ]
    fleet.spawn("router", command)
    wait_log(fleet.workdir / "router.log", "router listening", 1, fleet)
    fleet.start_ranks(settings, ranks, router=f"{HOST}:{rank_port}")
    for index in range(ranks):
        wait_log(fleet.workdir / f"rank-{index}.log", "registered", 1, fleet)
    return f"grpc://{HOST}:{port}"


def _peer_router(
    fleet: Fleet,
    settings: RankSettings,
    ranks: int,
    program: list[str],
    policy: str,
    ready: tuple[str, ...] = ("/health",),
) -> str:
    """Start `ranks` sim ranks and a peer router `program` in front of them; its HOST:PORT."""
    fleet.start_ranks(settings, ranks)
    port = free_port()
    command = [*program, "--host", HOST, "--port", str(port), "--policy", policy,
               *metrics_flags(), "--worker-urls", *fleet.rank_urls]  # fmt: skip
    fleet.spawn("router", command)
    for path in ready:
        wait_http(f"http://{HOST}:{port}{path}", fleet)
    return f"{HOST}:{port}"


def sglang_router(fleet: Fleet, settings: RankSettings, ranks: int, policy: str) -> str:
    """sglang-router over HTTP workers; replayed with text prompts (it takes no token ids)."""
    program = [str(BIN / "python"), "-m", "sglang_router.launch_router"]
    address = _peer_router(fleet, settings, ranks, program, policy, ("/health", "/v1/models"))
    return f"{TEXT_SCHEME}{address}"


def vllm_router(fleet: Fleet, settings: RankSettings, ranks: int, policy: str) -> str:
    """vllm-router over HTTP workers; token-id prompts (its cache_aware renders them)."""
    return f"http://{_peer_router(fleet, settings, ranks, [str(script('vllm-router'))], policy)}"


DYNAMO_PYTHON = Path(__file__).resolve().parents[1] / ".venv-dynamo" / "bin" / "python"


def dynamo_router(fleet: Fleet, settings: RankSettings, ranks: int, policy: str) -> str:
    """ai-dynamo-runtime's KvRouter / RadixTree (bench/dynamo_router.py, its own venv)."""
    fleet.start_ranks(settings, ranks)
    port = free_port()
    command = [
        str(DYNAMO_PYTHON),
        str(Path(__file__).with_name("dynamo_router.py")),
        "--port",
        str(port),
        "--policy",
        policy,
        "--model-path",
        str(settings.model_dir),
        "--block-size",
        str(settings.page_size),
        "--workdir",
        str(fleet.workdir),
        "--worker-urls",
        *fleet.rank_urls,
    ]
    fleet.spawn("router", command)
    wait_http(f"http://{HOST}:{port}/health", fleet)
    return f"http://{HOST}:{port}"


RouterLauncher = Callable[[Fleet, RankSettings, int, str], str]
ROUTERS: dict[str, RouterLauncher] = {
    "kvfleet": kvfleet_router,
    "sglang": sglang_router,
    "vllm": vllm_router,
    "dynamo": dynamo_router,
}
# What each router needs on PATH or importable, to say why an arm cannot run here.
ROUTER_NEEDS = {
    "kvfleet": "kvfleet",
    "sglang": "sglang-router",
    "vllm": "vllm-router",
    "dynamo": str(DYNAMO_PYTHON),  # a venv with ai-dynamo-runtime==1.6.1 (docs/peers.md)
}


def router_available(router: str) -> bool:
    """True when the router's executable is installed in this environment."""
    return script(ROUTER_NEEDS[router]).exists()
