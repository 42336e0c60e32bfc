"""Granite 4.0 hybrid (`GraniteMoeHybridForCausalLM`): its Mamba-2 layers go to the `state` life
cycle, its attention layers to `full`, and the engine with prefix cache, state snapshots and the
host tier gives transformers' greedy tokens. Logit parity: test_hf_parity.py."""

from __future__ import annotations

import random

import pytest
import torch
from engine_testkit import final, tokens_of, turn_after_host_flood
from hf_testkit import (
    engine_model_config,
    hf_greedy,
    hf_logits,
    paged_logits,
    random_tokens,
    save_tiny,
)
from kvfleet.kvstore.tiers.metrics import HOST
from kvfleet.services.engine.compute.backends import TorchCompute
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.model.hf_keys import ConfigError
from kvfleet.services.engine.model.weights import load_checkpoint
from test_hybrid_engine import CONFIG, PAGE, WITH_HOST, run_agent_turns

pytest.importorskip("transformers")

ARCH = "GraniteMoeHybridForCausalLM"
NEW_TOKENS = 8


def test_mamba_layers_are_the_state_group_and_attention_layers_full():
    """Mamba layers keep recurrent state (snapshots), attention layers every K/V block."""
    config = engine_model_config(ARCH)
    assert config.groups == {"ssm": (0, 2), "full": (1, 3)}
    assert (config.ssm_num_heads, config.ssm_head_dim, config.ssm_state_size) == (4, 32, 16)
    assert config.ssm_conv_kernel == 4 and config.use_rope
    assert (config.intermediate_size, config.moe_intermediate_size) == (48, 96)
    assert config.moe_layers == (0, 1, 2, 3) and config.norm_topk_prob
    scalars = (config.embedding_multiplier, config.residual_multiplier, config.logits_scaling)
    assert (*scalars, config.attention_scale) == (2.0, 0.7, 1.5, 0.3)
    dense = engine_model_config(ARCH, num_local_experts=0, position_embedding_type=None)
    assert dense.moe_layers == () and not dense.use_rope


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"mamba_n_groups": 2, "mamba_n_heads": 4}, "mamba_n_groups 2 is not supported"),
        ({"time_step_limit": (0.001, 0.1)}, "time_step_limit"),
        ({"mamba_proj_bias": True}, "mamba_proj_bias=True is not supported"),
    ],
)
def test_what_the_ssm_does_not_compute_is_refused(changes, message):
    """Grouped B/C, a clamped time step or projection biases would be served wrong: refuse."""
    with pytest.raises(ConfigError, match=message):
        engine_model_config(ARCH, **changes)


def test_dense_model_without_positions_equals_transformers(tmp_path):
    """Granite 4.0 H Micro's shape: no experts and no RoPE (position_embedding_type null);
    rotating q/k anyway, or running experts, would change the logits."""
    hf, path = save_tiny(ARCH, tmp_path, seed=3, num_local_experts=0, position_embedding_type=None)
    model = load_checkpoint(path)
    assert model.config.moe_layers == () and not model.config.use_rope
    tokens = random_tokens(50, seed=4)
    got = paged_logits(model, tokens, cuts=[13, 30])
    torch.testing.assert_close(got, hf_logits(hf, tokens), atol=2e-5, rtol=1e-4)


def _core(config) -> EngineCore:
    return EngineCore(config, compute=TorchCompute(config)).start()


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["per_conversation", "per_request"])
def test_snapshot_resumed_turns_give_transformers_greedy_tokens(tmp_path, policy):
    """A snapshot restored at the wrong boundary, or K/V pages that disagree with it, changes a
    token against transformers' full recompute; a missing snapshot shows in the resume point."""
    hf, path = save_tiny(ARCH, tmp_path, seed=11)
    core = _core(CONFIG.with_changes(model_path=str(path), reuse_policy=policy))
    rng = random.Random(7)
    prompt = [rng.randrange(256) for _ in range(150)]

    def same_as_transformers(turn, call, outputs):
        expected = hf_greedy(hf, list(call.prompt_token_ids), NEW_TOKENS)
        assert tokens_of(outputs) == expected, f"turn {turn}"

    try:
        run_agent_turns(core, prompt, rng, policy, NEW_TOKENS, same_as_transformers)
    finally:
        core.stop()


@pytest.mark.slow
def test_turn_onboarded_from_host_tier_gives_transformers_tokens(tmp_path, monkeypatch):
    """A state page offloaded to the host tier and onboarded must come back with its K/V."""
    hf, path = save_tiny(ARCH, tmp_path, seed=11)
    core = _core(WITH_HOST.with_changes(model_path=str(path)))
    try:
        first, second, outputs, metrics, onboarded = turn_after_host_flood(
            core, monkeypatch, NEW_TOKENS
        )
        assert final(outputs).usage.cached_tokens == (len(first) + NEW_TOKENS) // PAGE * PAGE
        assert metrics[HOST].hits > 0, metrics
        assert "ssm" in onboarded and "full" in onboarded, onboarded
        assert tokens_of(outputs) == hf_greedy(hf, list(second.prompt_token_ids), NEW_TOKENS)
        core.check_integrity()
    finally:
        core.stop()
