"""A bf16 decode step with the Triton decode matmuls and the one-kernel RoPE + KV write, in
Triton's interpreter on the CPU, against the same step without them (decode_kernels_parity.py)."""

from __future__ import annotations

from triton_interpreter import interpreted, needs_triton


@needs_triton
def test_the_decode_kernels_change_no_token_and_no_page():
    done = interpreted("decode_kernels_parity.py")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
