"""Small sim-backend engines and a weightless model directory for the peer-router tests."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.model.model_dir import write_model_dir

# Small pools, a short step budget (chunked prefill), no sleeping unless a test asks for it.
SIM_CONFIG = EngineConfig(
    model="tiny",
    compute_backend="sim",
    sim_time_scale=0.0,
    max_batch_size=4,
    max_num_batched_tokens=48,
    page_size=16,
    kv_pages=160,
    checkpoint_margin_tokens=32,
)


def tiny_model_dir(root: Path) -> Path:
    """config.json (the tiny preset) and the byte tokenizer.json under `root/model`."""
    return write_model_dir(root / "model", preset("tiny"))


START_TIMEOUT_S = 30.0


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_router(command: list[str], port: int, log: Path) -> subprocess.Popen:
    """Run a router process (output to `log`) until its /health answers on `port`."""
    env = {**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"router exited {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_process(process)
    raise TimeoutError(f"router on {port} not healthy within {START_TIMEOUT_S} s")


def stop_process(process: subprocess.Popen) -> None:
    """Terminate, then kill if it does not exit within 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
