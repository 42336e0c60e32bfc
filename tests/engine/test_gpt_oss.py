"""gpt-oss (sliding and full layers, attention sinks, clamped-SwiGLU experts, YaRN): the config
maps onto the engine's layer groups, and the engine with its prefix cache gives transformers'
greedy tokens across an agent's turns. Logit parity: test_hf_parity.py (GptOssForCausalLM)."""

from __future__ import annotations

import random

import pytest
from engine_testkit import TEST_CONFIG, final, greedy, run_call, tokens_of
from hf_testkit import engine_model_config, hf_greedy, save_tiny
from kvfleet.services.engine.compute.backends import TorchCompute
from kvfleet.services.engine.compute.tp import TPLayout, shard_config
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.request.engine_request import GenerateCall

pytest.importorskip("transformers")

ARCH = "GptOssForCausalLM"
NEW_TOKENS = 8


def test_layer_types_pick_the_window_group_and_the_rest_stay_full():
    """Sliding layers must keep KV in the window life cycle, full layers in the full one."""
    config = engine_model_config(ARCH)
    assert config.groups == {"window": (0, 2), "full": (1,)}
    assert config.window_size == 24
    assert config.attention_sinks and config.experts_kind == "gpt_oss"
    assert config.moe_layers == (0, 1, 2) and config.moe_intermediate_size == 96
    assert (config.qkv_bias, config.o_bias, config.swiglu_limit) == (True, True, 0.3)
    swapped = engine_model_config(
        ARCH, layer_types=["full_attention", "sliding_attention", "full_attention"]
    )
    assert swapped.groups == {"full": (0, 2), "window": (1,)}


def test_yarn_rope_as_the_config_says():
    """gpt-oss's YaRN is untruncated (truncate: false), theta 150000, over 4096 positions."""
    scaling = engine_model_config(ARCH).rope_scaling
    assert (scaling.kind, scaling.factor, scaling.truncate) == ("yarn", 32.0, False)
    assert (
        scaling.original_max_position == 4096 and engine_model_config(ARCH).rope_theta == 150000.0
    )


def test_no_sliding_window_means_every_layer_is_full():
    """transformers reads a null sliding_window as no window on any layer."""
    assert engine_model_config(ARCH, sliding_window=None).groups == {"full": (0, 1, 2)}


def test_tensor_parallel_is_refused_with_a_reason():
    """Sinks and gpt-oss experts are not split across workers: refuse rather than serve wrong."""
    with pytest.raises(ValueError, match="does not split attention sinks or gpt-oss experts"):
        shard_config(engine_model_config(ARCH), TPLayout(0, 2))


def _turns(rng: random.Random):
    """An agent loop's turns after the first: append, resend, rewrite the tail, append."""

    def append(prompt, output):
        return prompt + output + [rng.randrange(256) for _ in range(37)]

    def resend(prompt, _output):
        return list(prompt)

    def rewrite_tail(prompt, _output):
        return prompt[:-21] + [rng.randrange(256) for _ in range(25)]

    return [append, resend, rewrite_tail, append]


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy, backend",
    [("per_conversation", "reference"), ("per_request", "sdpa"), ("all_reusable", "reference")],
)
def test_prefix_cache_turns_give_transformers_greedy_tokens(tmp_path, policy, backend):
    """A window page reused past its window, a sink lost on a cached path, or a checkpoint
    resumed at the wrong position changes a token against transformers' full recompute."""
    hf, path = save_tiny(ARCH, tmp_path, seed=11)
    config = TEST_CONFIG.with_changes(
        model_path=str(path), reuse_policy=policy, attention_backend=backend
    )
    core = EngineCore(config, compute=TorchCompute(config)).start()
    rng = random.Random(5)
    prompt, output, cached = [rng.randrange(256) for _ in range(150)], [], []
    try:
        for turn, next_prompt in enumerate([None, *_turns(rng)]):
            if next_prompt is not None:
                prompt = next_prompt(prompt, output)
            call = GenerateCall(f"{policy}-t{turn}", tuple(prompt), greedy(NEW_TOKENS), "conv")
            outputs = run_call(core, call)
            output = tokens_of(outputs)
            assert output == hf_greedy(hf, prompt, NEW_TOKENS), f"turn {turn}"
            cached.append(final(outputs).usage.cached_tokens)
        core.check_integrity()
    finally:
        core.stop()
    assert cached[0] == 0 and all(count > 0 for count in cached[1:]), cached
