"""The fp8 paged decode kernel (attention/attn_decode_kernel.py), run in Triton's interpreter
on the CPU against the reference backend's fp32 math over the same fp8 pages."""

from __future__ import annotations

from triton_interpreter import interpreted, needs_triton


@needs_triton
def test_the_fp8_decode_kernel_equals_the_reference_attention():
    done = interpreted("decode_kernel_parity.py")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
