"""Every supported architecture, saved by transformers and loaded by the engine, computes what
transformers computes: fp32 logits through the paged cache in chunks, bf16/fp16 weights."""

from __future__ import annotations

import json

import pytest
import torch
from hf_testkit import ARCHS, hf_logits, paged_logits, random_tokens, save_tiny
from kvfleet.services.engine.model.weights import load_checkpoint

pytest.importorskip("transformers")


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_paged_chunked_logits_equal_transformers(tmp_path, arch):
    """A wrong bias, norm, window, router or weight mapping shows up as a logit difference."""
    hf, path = save_tiny(arch, tmp_path, seed=1)
    assert (path / "model.safetensors.index.json").is_file()  # sharded
    assert len(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]) > 1
    model = load_checkpoint(path)
    assert model.config.architecture == arch
    tokens = random_tokens(70, seed=2)
    expected = hf_logits(hf, tokens)
    got = paged_logits(model, tokens, cuts=[5, 6, 29, 50])
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_window_layers_follow_the_config(tmp_path):
    """Qwen2 slides the window from max_window_layers on; Mistral on every layer."""
    _, qwen = save_tiny("Qwen2ForCausalLM", tmp_path / "qwen", seed=1)
    _, mistral = save_tiny("MistralForCausalLM", tmp_path / "mistral", seed=1)
    _, llama = save_tiny("LlamaForCausalLM", tmp_path / "llama", seed=1)
    q, m, ll = (load_checkpoint(p).config for p in (qwen, mistral, llama))
    assert (q.window_layers, q.window_size) == ((1, 2), 24)
    assert (m.window_layers, m.window_size) == ((0, 1, 2), 24)
    assert ll.window_layers == () and ll.qkv_bias and ll.o_bias and ll.mlp_bias


def test_moe_router_top_k_and_renormalisation(tmp_path):
    """Qwen3-MoE keeps raw softmax weights unless norm_topk_prob; dense layers stay dense."""
    hf, path = save_tiny("Qwen3MoeForCausalLM", tmp_path / "raw", seed=3)
    hf_norm, path_norm = save_tiny("Qwen3MoeForCausalLM", tmp_path / "norm", seed=3,
                                   norm_topk_prob=True)  # fmt: skip
    raw, norm = load_checkpoint(path), load_checkpoint(path_norm)
    assert raw.config.moe_layers == (0, 2) and not raw.config.norm_topk_prob
    assert norm.config.norm_topk_prob
    tokens = random_tokens(40, seed=4)
    for ours, theirs in ((raw, hf), (norm, hf_norm)):
        got = paged_logits(ours, tokens, cuts=[17])
        torch.testing.assert_close(got, hf_logits(theirs, tokens), atol=2e-5, rtol=1e-4)
    assert not torch.allclose(paged_logits(raw, tokens, []), paged_logits(norm, tokens, []))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoint_loads_in_its_dtype(tmp_path, dtype):
    """torch_dtype decides the dtype unless overridden; weights arrive bit for bit."""
    hf, path = save_tiny("Qwen3ForCausalLM", tmp_path, seed=5, dtype=dtype)
    model = load_checkpoint(path)
    assert next(model.parameters()).dtype == dtype
    theirs = hf.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    wide = load_checkpoint(path, dtype=torch.float32)
    assert next(wide.parameters()).dtype == torch.float32
    tokens = random_tokens(30, seed=6)
    torch.testing.assert_close(
        paged_logits(model, tokens, [11]), hf_logits(hf, tokens), atol=0.15, rtol=0.05
    )


def test_single_file_checkpoint_loads(tmp_path):
    """An unsharded model.safetensors (small models) loads like a sharded one."""
    hf, path = save_tiny("LlamaForCausalLM", tmp_path / "sharded", seed=7)
    hf.save_pretrained(tmp_path / "single")
    assert not (tmp_path / "single" / "model.safetensors.index.json").exists()
    tokens = random_tokens(20, seed=8)
    single = paged_logits(load_checkpoint(tmp_path / "single"), tokens, [])
    assert torch.equal(single, paged_logits(load_checkpoint(path), tokens, []))


def test_expert_loop_fallback_equals_grouped_mm(monkeypatch):
    """Devices/dtypes without grouped_mm take the loop; both must compute the same experts."""
    from kvfleet.services.engine.model import moe

    gen = torch.Generator().manual_seed(9)
    x, weight = torch.randn(12, 16, generator=gen), torch.randn(3, 8, 16, generator=gen)
    offsets = torch.tensor([5, 5, 12], dtype=torch.int32)  # expert 1 gets no rows
    grouped = moe.grouped_linear(x, weight, offsets)
    monkeypatch.setattr(moe, "_GROUPED_MM", None)
    looped = moe.grouped_linear(x, weight, offsets)
    expected = torch.cat([x[:5] @ weight[0].T, x[5:] @ weight[2].T])
    torch.testing.assert_close(grouped, expected)
    torch.testing.assert_close(looped, expected)
