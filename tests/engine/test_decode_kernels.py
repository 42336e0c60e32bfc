"""A bf16 decode step with the Triton decode matmuls and the one-kernel RoPE + KV write, in
Triton's interpreter on the CPU, against the same step without them (decode_kernels_parity.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Found, not imported: Triton is imported only in the interpreted process below.
pytestmark = pytest.mark.skipif(not importlib.util.find_spec("triton"), reason="no Triton")


def test_the_decode_kernels_change_no_token_and_no_page():
    done = subprocess.run(
        [sys.executable, "decode_kernels_parity.py"],
        cwd=Path(__file__).parent,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
