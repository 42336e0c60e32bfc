"""`kvfleet up --smoke` starts a router and two ranks, talks through both APIs, exits 0."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

REPO = Path(__file__).resolve().parents[2]


def test_up_smoke_runs_two_turns_through_both_apis_and_exits_zero():
    """README's main job command failing would leave a new user with nothing that runs."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "kvfleet.services.cli", "up", "--smoke",
         "--router-port", "0", "--http-port", "0", "--metrics-port", "0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "router: grpc://127.0.0.1:" in out and "OpenAI base URL: http://127.0.0.1:" in out
    assert "metrics: http://127.0.0.1:" in out
    assert "grpc turn 2" in out and "http turn 2" in out and "smoke: ok" in out
    assert "stopped." in out
    # nothing after it: no leak report of the compiled libraries torch loaded (triton's)
    assert "leaked" not in result.stderr, result.stderr[-2000:]


def test_up_on_a_busy_port_exits_two_and_names_the_port():
    """A taken port would otherwise end in a traceback that does not say what to change."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "kvfleet.services.cli", "up", "--smoke",
             "--router-port", "0", "--http-port", str(port), "--metrics-port", "0"],
            cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"could not bind 127.0.0.1:{port}" in result.stderr
    assert "--http-port" in result.stderr
    assert "stopped." in result.stdout
