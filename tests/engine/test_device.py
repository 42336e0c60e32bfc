"""Which device a rank computes on, and the warning when a GPU was asked for but not found."""

from __future__ import annotations

import logging

import pytest
import torch
from kvfleet.services.engine.compute.backends import TorchCompute
from kvfleet.services.engine.compute.device import resolve_device
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict

LOGGER = "kvfleet.services.engine.compute.device"


def no_cuda() -> bool:
    return False


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_auto_is_the_default_and_picks_cuda_when_present():
    """If this fails, a GPU pod computes on CPU (the old default) or auto ignores CUDA."""
    assert EngineConfig().device == "auto"
    assert resolve_device("auto", {}, cuda_available=lambda: True) == torch.device("cuda")
    assert resolve_device("cuda:1", {}, cuda_available=lambda: True) == torch.device("cuda:1")
    assert resolve_device("auto", {}, cuda_available=no_cuda) == torch.device("cpu")


@pytest.mark.parametrize(
    ("requested", "environ", "named"),
    [
        ("auto", {"CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES='0'"),
        ("auto", {"NVIDIA_VISIBLE_DEVICES": "all"}, "NVIDIA_VISIBLE_DEVICES='all'"),
        ("cuda", {}, "device='cuda'"),
    ],
)
def test_a_gpu_asked_for_but_missing_warns_with_the_numbers(caplog, requested, environ, named):
    """If this fails, a GPU pod without a visible GPU computes on CPU without a word."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        device = resolve_device(requested, environ, cuda_available=no_cuda, device_count=lambda: 0)
    assert device == torch.device("cpu")
    (message,) = warnings_of(caplog)
    assert named in message
    assert "torch sees 0 CUDA devices" in message
    assert f"torch {torch.__version__}" in message


@pytest.mark.parametrize(
    ("requested", "environ"),
    [
        ("auto", {}),
        ("auto", {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}),
        ("cpu", {"CUDA_VISIBLE_DEVICES": "0"}),  # an explicit cpu is what was asked for
    ],
)
def test_no_gpu_asked_for_gives_no_warning(caplog, requested, environ):
    """If this fails, every CPU rank (tests, `kvfleet up`) warns about a GPU nobody asked for."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert resolve_device(requested, environ, cuda_available=no_cuda) == torch.device("cpu")
    assert warnings_of(caplog) == []


def test_a_bad_device_names_the_field():
    """If this fails, a typo in device gives a bare torch error (or runs somewhere else)."""
    for bad in ("gpu", "mps"):
        with pytest.raises(ValueError, match="device"):
            resolve_device(bad, {}, cuda_available=no_cuda)


def test_engine_yaml_sets_the_device():
    """If this fails, the operator's engine.yaml cannot pin a device."""
    assert engine_config_from_dict({"engine": {"device": "cuda"}}).device == "cuda"
    assert engine_config_from_dict({}).device == "auto"


def test_a_cpu_machine_with_a_gpu_pod_environment_runs_on_cpu_and_warns(caplog, monkeypatch):
    """If this fails, a rank on a GPU-less node crashes or hides that it computes on CPU."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CPU fallback is not what runs")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        compute = TorchCompute(EngineConfig(model="tiny"))
    assert compute.device == torch.device("cpu")
    assert compute.model.lm_head.weight.device.type == "cpu"
    (message,) = warnings_of(caplog)
    assert "CUDA_VISIBLE_DEVICES='0'" in message


def test_engine_flags_set_the_device_and_the_budget():
    """If this fails, `kvfleet engine --device/--gpu-memory-fraction/--cpu-kv-gib` is ignored."""
    from kvfleet.services.cli import build_parser
    from kvfleet.services.engine.rank.cli import engine_config_from_args

    flags = ["--device", "cuda:1", "--gpu-memory-fraction", "0.5", "--cpu-kv-gib", "2"]
    config = engine_config_from_args(build_parser().parse_args(["engine", *flags]))
    assert (config.device, config.gpu_memory_fraction, config.cpu_kv_gib) == ("cuda:1", 0.5, 2)
    default = engine_config_from_args(build_parser().parse_args(["engine"]))
    assert (default.device, default.gpu_memory_fraction, default.cpu_kv_gib) == ("auto", 0.9, 4)


def test_auto_splits_a_pods_ranks_one_gpu_each():
    """If this fails, every rank of a multi-rank GPU pod on `device: auto` shares GPU 0."""
    from kvfleet.services.engine.rank.pod_ranks import rank_device

    assert [rank_device("auto", i, 2, cuda_available=lambda: True) for i in (0, 1)] == [
        "cuda:0",
        "cuda:1",
    ]
    assert rank_device("auto", 1, 2, cuda_available=no_cuda) == "auto"
    assert rank_device("auto", 0, 1, cuda_available=lambda: True) == "auto"
