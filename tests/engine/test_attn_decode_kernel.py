"""The fp8 paged decode kernel (attention/attn_decode_kernel.py), run in Triton's interpreter
on the CPU against the reference backend's fp32 math over the same fp8 pages. The interpreter
must be chosen before Triton is imported, so the check runs in a process of its own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Found, not imported: Triton is imported only in the interpreted process below.
pytestmark = pytest.mark.skipif(not importlib.util.find_spec("triton"), reason="no Triton")


def test_the_fp8_decode_kernel_equals_the_reference_attention():
    done = subprocess.run(
        [sys.executable, "decode_kernel_parity.py"],
        cwd=Path(__file__).parent,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
