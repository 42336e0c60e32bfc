"""Runs a script or pytest module in Triton's interpreter, on the CPU. The interpreter must be
chosen before Triton is imported, so each check runs in a process of its own; Triton itself is
found here, not imported."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

needs_triton = pytest.mark.skipif(not importlib.util.find_spec("triton"), reason="no Triton")
HERE = Path(__file__).parent


def interpreted(*args: str) -> subprocess.CompletedProcess:
    """`python ARGS` in this folder with TRITON_INTERPRET=1; output captured as text."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=HERE, env=env, capture_output=True, text=True, timeout=600
    )
