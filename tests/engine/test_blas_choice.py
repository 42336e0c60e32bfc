"""cuBLASLt for forwards of a few rows on CUDA, cuBLAS restored after; nothing changes on CPU.

The CPU build cannot switch libraries, so the switch is recorded through monkeypatch; the
speed it buys is measured by bench/gpu/gemm_bench.py on the GPU."""

from __future__ import annotations

import pytest
import torch
from kvfleet.services.engine.compute import blas_choice
from kvfleet.services.engine.compute.blas_choice import LT_MAX_ROWS, blas_for_rows


@pytest.fixture
def library(monkeypatch):
    state = {"now": "cublas", "sets": []}

    def preferred(backend=None):
        if backend is not None:
            state["now"] = backend
            state["sets"].append(backend)
        return state["now"]

    monkeypatch.setattr(blas_choice.torch.backends.cuda, "preferred_blas_library", preferred)
    return state


def test_a_few_rows_on_cuda_run_in_cublaslt_and_the_choice_is_restored(library):
    with blas_for_rows(LT_MAX_ROWS, torch.device("cuda")):
        assert library["now"] == "cublaslt"
    assert library["now"] == "cublas"


def test_the_choice_is_restored_when_the_forward_raises(library):
    with pytest.raises(RuntimeError), blas_for_rows(8, torch.device("cuda")):
        raise RuntimeError("a forward that fails")
    assert library["now"] == "cublas"


@pytest.mark.parametrize("rows,device", [(LT_MAX_ROWS + 1, "cuda"), (1, "cpu")])
def test_larger_forwards_and_the_cpu_change_nothing(library, rows, device):
    with blas_for_rows(rows, torch.device(device)):
        assert library["now"] == "cublas"
    assert library["sets"] == []
