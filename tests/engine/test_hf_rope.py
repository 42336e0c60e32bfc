"""RoPE scaling agrees with transformers at positions past the original (pretraining) context."""

from __future__ import annotations

import pytest
import torch
from hf_testkit import hf_logits, paged_logits, random_tokens, save_tiny
from kvfleet.services.engine.model.weights import load_checkpoint

pytest.importorskip("transformers")

ORIGINAL = 32  # the pretraining context; every test sequence runs well past it

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
        "beta_fast": 16.0,
        "mscale": 0.8,
        "mscale_all_dim": 0.6,
        "truncate": False,
    },
}


def _rope(kind: str, theta: float = 10000.0) -> dict:
    return {**SCALINGS[kind], "rope_theta": theta}


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_scaled_rope_logits_equal_transformers_past_the_original_context(tmp_path, kind):
    """Ignoring rope_scaling (as a loader that drops keys would) changes every later logit."""
    hf, path = save_tiny("LlamaForCausalLM", tmp_path, seed=1, head_dim=32,
                         rope_parameters=_rope(kind, 500000.0))  # fmt: skip
    model = load_checkpoint(path)
    assert model.config.rope_scaling.kind == kind.split("-")[0]
    tokens = random_tokens(3 * ORIGINAL, seed=2)
    expected = hf_logits(hf, tokens)
    got = paged_logits(model, tokens, [40, 41])
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    plain = model.config.with_changes(rope_scaling=None)
    unscaled = type(model)(plain)
    unscaled.load_state_dict(model.state_dict())
    assert not torch.allclose(paged_logits(unscaled, tokens, [])[ORIGINAL:], expected[ORIGINAL:])


def test_dynamic_ntk_equals_transformers_decoding_token_by_token(tmp_path):
    """Dynamic NTK rotates each token with the base of a sequence that ends at it, which is what
    transformers computes when it decodes one token at a time with its KV cache."""
    hf, path = save_tiny("Qwen3ForCausalLM", tmp_path, seed=3, max_position_embeddings=ORIGINAL,
                         rope_parameters={"rope_type": "dynamic", "factor": 3.0,
                                          "rope_theta": 10000.0})  # fmt: skip
    model = load_checkpoint(path)
    assert model.config.max_position == 3 * ORIGINAL
    tokens = random_tokens(80, seed=4)
    expected, past = [], None
    with torch.no_grad():
        for token in tokens:
            out = hf(torch.tensor([[token]]), cache=past, use_cache=True)
            past = out.cache
            expected.append(out.logits[0, -1].float())
    expected = torch.stack(expected)
    got = paged_logits(model, tokens, [10, 33, 34, 60])
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
