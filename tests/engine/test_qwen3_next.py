"""Qwen3-Next (`Qwen3NextForCausalLM`): its gated delta rule layers go to the `state` life cycle,
its gated attention layers to `full`; fp32 logits equal transformers' for a prompt and for
decode steps; the chunked form and the batched decode step equal the recurrence; and the engine
with prefix cache, state snapshots and the host tier gives the tokens (and log probabilities)
of an empty cache, and transformers' tokens. Parity in chunks cut mid-block: test_hf_parity.py."""

from __future__ import annotations

import random

import pytest
import torch
from engine_testkit import final, run_call, tokens_of, turn_after_host_flood
from hf_testkit import (
    engine_model_config,
    hf_config,
    hf_greedy,
    hf_logits,
    paged_logits,
    random_tokens,
    save_tiny,
)
from kvfleet.kvstore.tiers.metrics import HOST
from kvfleet.services.engine.attention.batch import StateRows
from kvfleet.services.engine.compute.backends import TorchCompute
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.model.gated_delta import DeltaShape, GatedDeltaNet
from kvfleet.services.engine.model.hf_keys import ConfigError
from kvfleet.services.engine.model.registry import model_config_from_hf
from kvfleet.services.engine.model.ssm import SSMState
from kvfleet.services.engine.model.weights import build_model, load_checkpoint
from kvfleet.services.engine.request.engine_request import GenerateCall
from test_hybrid_engine import CONFIG, PAGE, WITH_HOST, _assert_same, run_agent_turns

pytest.importorskip("transformers")

ARCH = "Qwen3NextForCausalLM"
NEW_TOKENS = 8


def test_delta_layers_are_the_state_group_and_attention_layers_full():
    """Linear attention keeps a recurrent state (snapshots), gated attention every K/V block;
    the state page holds the conv window and the [value heads, key dim, value dim] state."""
    config = engine_model_config(ARCH)
    assert config.groups == {"ssm": (0, 1, 3), "full": (2,)}
    shape = (config.ssm_num_heads, config.ssm_head_dim, config.ssm_num_groups)
    assert (*shape, config.ssm_state_size, config.ssm_conv_kernel) == (4, 12, 2, 8, 4)
    assert config.ssm_state_floats == 3 * (2 * 2 * 8 + 4 * 12) + 4 * 8 * 12
    assert DeltaShape.of(config).state_numel == config.ssm_state_floats
    assert (config.head_dim, config.rotary_dim) == (16, 4)  # partial_rotary_factor 0.25
    assert config.moe_layers == (0, 2, 3) and config.norm_topk_prob
    assert (config.moe_intermediate_size, config.shared_expert_intermediate_size) == (32, 48)
    assert engine_model_config(ARCH, num_experts=0).moe_layers == ()
    for dense in (False, True):  # the weight bytes the device budget sets aside
        shaped = engine_model_config(ARCH, num_experts=0, attention_bias=True) if dense else config
        model = build_model(shaped)
        assert shaped.num_parameters() == sum(p.numel() for p in model.parameters())


def test_hub_config_layout_reads_as_transformers_5_writes_it():
    """The hub's configs (transformers 4): partial_rotary_factor and rope_theta at the top,
    layer kinds from full_attention_interval, use_sliding_window false."""
    v5 = _saved(layer_types=["linear_attention", "full_attention"] * 2)
    v5["rope_parameters"] = {**v5["rope_parameters"], "partial_rotary_factor": 0.5}
    v4 = {k: v for k, v in v5.items() if k not in ("rope_parameters", "layer_types", "dtype")}
    v4.update(partial_rotary_factor=0.5, rope_theta=10000.0, rope_scaling=None)
    v4.update(full_attention_interval=2, use_sliding_window=False, torch_dtype="float32")
    assert model_config_from_hf(v4) == model_config_from_hf(v5)
    assert model_config_from_hf(v4).ssm_layers == (0, 2)
    assert model_config_from_hf(v4).rotary_dim == 8


def _saved(**changes) -> dict:
    return hf_config(ARCH, **changes).to_dict()


def _rope_factor(factor: float) -> dict:
    data = _saved()
    data["rope_parameters"] = {**data["rope_parameters"], "partial_rotary_factor": factor}
    return data


@pytest.mark.parametrize(
    "data, message",
    [
        (_saved(linear_num_value_heads=3), "linear_num_value_heads 3 is not a multiple"),
        (_saved(layer_types=["linear_attention"] * 4), "at least one linear_attention and one"),
        (_saved(use_sliding_window=True), "use_sliding_window=True is not supported"),
        (_saved(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
        (_saved(shared_expert_intermediate_size=0), "shared_expert_intermediate_size 0"),
        (_rope_factor(0.1875), "partial_rotary_factor 0.1875 gives 3 rotary dims"),
    ],
)
def test_what_the_engine_does_not_compute_is_refused(data, message):
    """Value heads that no key head serves evenly, a model without one of the two layer kinds,
    a window, another activation, no shared expert or an odd rotary width: refused by name."""
    with pytest.raises(ConfigError, match=message):
        model_config_from_hf(data)


def test_prompt_and_decode_steps_equal_transformers(tmp_path):
    """Prefill, then six decode steps through the state pages (the batched step: conv window and
    delta state from the pages), against transformers' own cached decode (its recurrence)."""
    hf, path = save_tiny(ARCH, tmp_path, seed=1)
    model = load_checkpoint(path)
    prompt, steps = random_tokens(45, seed=2), random_tokens(6, seed=3)
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True)
        expected = [out.logits[0].float()]
        for token in steps:
            out = hf(torch.tensor([[token]]), cache=out.cache, use_cache=True)
            expected.append(out.logits[0].float())
    cuts = [len(prompt) + i for i in range(len(steps))]
    got = paged_logits(model, prompt + steps, cuts=cuts)
    torch.testing.assert_close(got, torch.cat(expected), atol=2e-5, rtol=1e-4)
    assert torch.equal(got.argmax(-1), torch.cat(expected).argmax(-1))
    # the prompt alone, in one forward: transformers' uncached logits too
    torch.testing.assert_close(got[: len(prompt)], hf_logits(hf, prompt), atol=2e-5, rtol=1e-4)


def _layer(seed: int = 0) -> GatedDeltaNet:
    shape = DeltaShape(hidden_size=32, key_heads=2, value_heads=4, key_dim=8, value_dim=6)
    layer = GatedDeltaNet(shape)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
        layer.reset_dynamics()
        layer.A_log.sub_(2.0)  # slow decays, so the starting state still counts at the end
    return layer


def _random_state(shape: DeltaShape, seed: int) -> SSMState:
    gen = torch.Generator().manual_seed(seed)
    state = SSMState.zeros(shape)
    return SSMState(torch.randn(state.conv.shape, generator=gen),
                    torch.randn(state.ssm.shape, generator=gen) * 0.5)  # fmt: skip


@pytest.mark.parametrize("count", [1, 37, 64, 130])
def test_chunked_form_equals_the_recurrence(count):
    """Outputs, end state and the snapshots inside the chunk (block ends a resumed turn reads),
    from a non-zero state, on and off the 64-token chunk size."""
    layer = _layer()
    x = torch.randn(count, 32, generator=torch.Generator().manual_seed(count))
    state = _random_state(layer.shape, 1)
    keep = frozenset(t for t in (0, 15, 31, 63, 64, 100) if t < count)
    with torch.no_grad():
        y, end, kept = layer(x, state, keep, chunked=True)
        y_ref, end_ref, kept_ref = layer(x, state, keep, chunked=False)
    close = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(y, y_ref, **close)
    torch.testing.assert_close(end.flat(), end_ref.flat(), **close)
    assert sorted(kept) == sorted(kept_ref) == sorted(keep)
    for t in keep:
        torch.testing.assert_close(kept[t].flat(), kept_ref[t].flat(), **close, msg=f"after {t}")


def test_batched_decode_step_equals_each_row_alone():
    """Rows reading their own page, another row's page, the null page (a first token) and a
    pad row: outputs and written pages equal stepping each row by the recurrence; the pad row
    leaves the null page zero."""
    layer, numel = _layer(seed=2), _layer().shape.state_numel
    states = torch.randn(8, numel + 3, generator=torch.Generator().manual_seed(3))
    states[0] = 0.0  # the null page
    read, write = torch.tensor([3, 3, 0, 5, 0]), torch.tensor([3, 6, 7, 5, 0])
    keep = torch.tensor([True, True, True, True, False])
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4))
    before = states.clone()
    with torch.no_grad():
        got = layer.decode(x, states, StateRows(read, write, keep))
        for row in range(4):
            state = SSMState.from_flat(layer.shape, before[read[row]])
            y, after, _ = layer(x[row : row + 1], state, chunked=False)
            torch.testing.assert_close(got[row], y[0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(states[write[row], :numel], after.flat())
    assert not states[0].any()
    torch.testing.assert_close(states[:, numel:], before[:, numel:])  # past the state: untouched


def _fresh(call: GenerateCall, config) -> list:
    """Every output of `call` from an empty cache: every token recomputed."""
    core = EngineCore(config, compute=TorchCompute(config)).start()
    try:
        outputs = run_call(core, call)
        assert final(outputs).usage.cached_tokens == 0
        return outputs
    finally:
        core.stop()


@pytest.mark.slow
@pytest.mark.parametrize("decode", ["off", "static"])
def test_cached_turns_equal_an_empty_cache_and_transformers(tmp_path, decode):
    """Append, resend, rewrite-tail and append turns under per_conversation retention: a
    snapshot restored at the wrong boundary, or K/V pages that disagree with it, changes a
    token or a log probability against the empty cache; a missing snapshot shows in the
    resume point. `static`: decodes through the static buffers decode graphs replay, against
    an eager empty cache."""
    hf, path = save_tiny(ARCH, tmp_path, seed=11)
    config = CONFIG.with_changes(
        model_path=str(path), reuse_policy="per_conversation", max_num_batched_tokens=40
    )
    served = config.with_changes(decode_graphs=decode)
    core = EngineCore(served, compute=TorchCompute(served)).start()
    rng = random.Random(7)
    # 156 tokens: every turn's decodes cross a block end (a step reading one page, writing
    # the next)
    prompt = [rng.randrange(256) for _ in range(156)]

    def same_as_empty_cache_and_transformers(turn, call, outputs):
        _assert_same(outputs, _fresh(call, config), f"turn {turn}")
        expected = hf_greedy(hf, list(call.prompt_token_ids), NEW_TOKENS)
        assert tokens_of(outputs) == expected, f"turn {turn}"

    try:
        run_agent_turns(core, prompt, rng, "q", NEW_TOKENS, same_as_empty_cache_and_transformers)
    finally:
        core.stop()


@pytest.mark.slow
def test_turn_onboarded_from_host_tier_equals_an_empty_cache(tmp_path, monkeypatch):
    """State pages offloaded to the host tier and onboarded must come back with their K/V."""
    _, path = save_tiny(ARCH, tmp_path, seed=11)
    config = WITH_HOST.with_changes(model_path=str(path))
    core = EngineCore(config, compute=TorchCompute(config)).start()
    try:
        first, second, outputs, metrics, onboarded = turn_after_host_flood(
            core, monkeypatch, NEW_TOKENS
        )
        assert final(outputs).usage.cached_tokens == (len(first) + NEW_TOKENS) // PAGE * PAGE
        assert metrics[HOST].hits > 0, metrics
        assert "ssm" in onboarded and "full" in onboarded, onboarded
        _assert_same(outputs, _fresh(second, config), "turn 2 from host")
        core.check_integrity()
    finally:
        core.stop()
