"""The hybrid decode step's Triton kernels (model/ssm_step_kernel.py), run in Triton's
interpreter on the CPU. The interpreter must be chosen before Triton is imported, so each check
runs in a process of its own: the kernels against the torch step, and the batched-decode tests
with the kernels serving every SSM layer's decode."""

from __future__ import annotations

from triton_interpreter import interpreted, needs_triton

pytestmark = needs_triton


def test_the_in_place_kernels_equal_the_torch_step_and_its_scatter():
    done = interpreted("ssm_kernel_parity.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_batched_decode_serves_the_same_tokens_through_the_kernels():
    done = interpreted(
        "-m", "pytest", "test_hybrid_decode.py", "-q", "-p", "no:cacheprovider", "-x"
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
