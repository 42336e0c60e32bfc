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


@needs_triton
def test_a_tiling_keeps_only_the_stages_shared_memory_holds():
    from kvfleet.services.engine.model.decode_matmul_kernel import MatmulShape, stages_within

    hopper = 232448  # the H100's and H200's shared memory a block may opt into
    narrow = MatmulShape(block_n=64, block_k=128, num_stages=5)
    assert stages_within(narrow, 64, 1, hopper) == 5  # 32 KB a stage
    assert stages_within(narrow, 64, 2, hopper) == 4  # gated: 48 KB a stage, 240 KB at 5
    assert stages_within(narrow, 16, 2, hopper) == 5  # few rows: 36 KB a stage
    assert stages_within(MatmulShape(block_n=256, block_k=256, num_stages=3), 64, 2, hopper) == 1


@needs_triton
def test_a_tiling_the_device_cannot_build_falls_back_to_cublas(monkeypatch):
    from kvfleet.services.engine.model.decode_matmul_kernel import MatmulShape, fits
    from triton.runtime.errors import OutOfResources

    tried = []

    def refused(*args, silu_gated):  # what Triton raises at a launch the device cannot hold
        tried.append(silu_gated)
        raise OutOfResources(245760, 232448, "shared memory")

    monkeypatch.setattr(decode_matmul, "_kernel", lambda device_type: (refused, fits, MatmulShape))
    monkeypatch.setattr(decode_matmul, "_refused", set())
    decode_matmul.shape_for.cache_clear()
    decode_matmul.enable(True)
    try:
        x = torch.randn(4, 256, dtype=torch.bfloat16)
        w = torch.randn(128, 256, dtype=torch.bfloat16)
        for _ in range(2):
            assert torch.equal(decode_matmul.linear(x, w, None), F.linear(x, w))
            assert decode_matmul.silu_gated_linear(x, w, None) is None
        assert tried == [False, True]  # one try per weight and form; cuBLAS's from then on
    finally:
        decode_matmul.enable(False)
        decode_matmul.shape_for.cache_clear()
