"""Tensor parallelism on CPU: two gloo workers of one rank give TP-1's greedy tokens and
logits (fp32, tight tolerance) over the paged cache, with chunked prefill and a prefix hit on
pages that went through the host tier and back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_testkit import save_tiny
from kvfleet.services.engine.attention.backends import make_backend
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.compute.tp import TPLayout, load_sharded_checkpoint, shard_config
from kvfleet.services.engine.model.tiny_checkpoint import write_tiny_checkpoint
from kvfleet.services.engine.model.weights import load_checkpoint
from tp_scenario import kv_bytes, run_scenario
from tp_testkit import run_workers

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

SCRIPT = Path(__file__).with_name("tp_scenario.py")


def _tp1(checkpoint: Path) -> dict:
    model = load_checkpoint(checkpoint, "cpu", torch.float32)
    tier, cache = kv_bytes(model.config)
    backend = make_backend(None, "cpu")

    def forward(chunks):
        return model(ForwardBatch.build(chunks, cache), cache, backend)

    return run_scenario(forward, model.config.groups, SequenceChunk, tier)


def _tp_run(checkpoint: Path, world: int, tmp: Path) -> dict:
    out = tmp / "result.pt"
    run_workers(SCRIPT, world, tmp, f"--checkpoint={checkpoint}", f"--out={out}")
    return torch.load(out)


def _checkpoint(maker: str, arch: str, directory: Path) -> Path:
    """`tiny`: the engine's writer (per-expert MoE tensors); `hf`: transformers'
    save_pretrained (Llama with o_proj/down_proj biases, Mixtral in its own expert layout)."""
    if maker == "tiny":
        return write_tiny_checkpoint(directory, arch, seed=3, dtype="float32")
    model, directory = save_tiny(arch, directory, seed=3)
    with torch.no_grad():  # transformers initialises biases to zero: make them count
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(directory, max_shard_size="40KB")
    return directory


@pytest.mark.parametrize(
    ("maker", "arch"),
    [
        ("tiny", "Qwen2ForCausalLM"),  # q/k/v biases, window and full layer groups
        ("tiny", "Qwen3MoeForCausalLM"),  # q/k norms, experts
        ("hf", "LlamaForCausalLM"),  # row-parallel biases: added once, by worker 0
        ("hf", "MixtralForCausalLM"),
    ],
)
def test_tp2_matches_tp1(tmp_path: Path, maker: str, arch: str) -> None:
    checkpoint = _checkpoint(maker, arch, tmp_path / "ckpt")
    expected = _tp1(checkpoint)
    got = _tp_run(checkpoint, 2, tmp_path)
    assert got["kv_heads"] == 1  # each worker's pages hold one of the two KV heads
    assert got["tokens_a"] == expected["tokens_a"]
    assert got["tokens_b"] == expected["tokens_b"]
    assert len(got["logits"]) == len(expected["logits"])
    for step, (a, b) in enumerate(zip(got["logits"], expected["logits"], strict=True)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5, msg=f"step {step}")


def test_shard_reads_only_its_slice(tmp_path: Path) -> None:
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", "Qwen2ForCausalLM", dtype="float32")
    full = load_checkpoint(checkpoint, "cpu", torch.float32)
    half = load_sharded_checkpoint(checkpoint, TPLayout(1, 2), dtype=torch.float32)
    attn, ref = half.model.layers[0].self_attn, full.model.layers[0].self_attn
    torch.testing.assert_close(attn.q_proj.weight, ref.q_proj.weight[32:])
    torch.testing.assert_close(attn.k_proj.bias, ref.k_proj.bias[16:])
    torch.testing.assert_close(attn.o_proj.weight, ref.o_proj.weight[:, 32:])
    mlp, ref_mlp = half.model.layers[0].mlp, full.model.layers[0].mlp
    torch.testing.assert_close(mlp.down_proj.weight, ref_mlp.down_proj.weight[:, 64:])


def test_uneven_split_is_refused(tmp_path: Path) -> None:
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", "Qwen2ForCausalLM", dtype="float32")
    config = load_checkpoint(checkpoint, "cpu", torch.float32).config
    with pytest.raises(ValueError, match=r"tensor_parallel=4 does not divide.*num_kv_heads"):
        shard_config(config, TPLayout(0, 4))
