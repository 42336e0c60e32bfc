"""The decode matmul kernel (model/decode_matmul_kernel.py) in Triton's interpreter on the CPU,
against fp32 math; and that with the switch off every projection is cuBLAS's (F.linear)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kvfleet.services.engine.model import decode_matmul
from triton_interpreter import interpreted, needs_triton


@needs_triton
def test_the_decode_matmul_kernel_equals_fp32_math():
    done = interpreted("decode_matmul_parity.py")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]


def test_off_or_on_a_cpu_every_projection_is_f_linear():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    layer = decode_matmul.Linear(64, 32, bias=True).to(torch.bfloat16)
    want = F.linear(x, layer.weight, layer.bias)
    assert torch.equal(layer(x), want)
    decode_matmul.enable(True)
    try:  # no interpreter in this process: the CPU has no kernel to take the call
        assert torch.equal(layer(x), want)
    finally:
        decode_matmul.enable(False)
