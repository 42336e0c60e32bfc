"""`kvfleet up --smoke` starts a router and two ranks, talks through both APIs, exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_up_smoke_runs_two_turns_through_both_apis_and_exits_zero():
    """README's main job command failing would leave a new user with nothing that runs."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "kvfleet.services.cli", "up", "--smoke",
         "--router-port", "0", "--http-port", "0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "router: grpc://127.0.0.1:" in out and "OpenAI base URL: http://127.0.0.1:" in out
    assert "grpc turn 2" in out and "http turn 2" in out and "smoke: ok" in out
    assert "stopped." in out
