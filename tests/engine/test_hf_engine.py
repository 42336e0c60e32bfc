"""The serving engine on a transformers-saved checkpoint gives transformers' greedy tokens, turn
after turn: chunked prefill, prefix-cache hits, a rewritten tail, window pages sliding out."""

from __future__ import annotations

import random

import pytest
import torch
from engine_testkit import TEST_CONFIG, final, greedy, run_call, tokens_of
from hf_testkit import ARCHS, hf_greedy, save_tiny
from kvfleet.services.engine.compute.backends import TorchCompute
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.request.engine_request import GenerateCall

pytest.importorskip("transformers")

NEW_TOKENS = 8


def _turns(rng: random.Random):
    """Prompt of turn n+1 from turn n's prompt and output: append, rewrite the tail, append."""

    def append(prompt, output):
        return prompt + output + [rng.randrange(256) for _ in range(37)]

    def rewrite_tail(prompt, _output):
        return prompt[:-21] + [rng.randrange(256) for _ in range(25)]

    return [append, rewrite_tail, append]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_engine_greedy_tokens_equal_transformers_across_turns(tmp_path, arch):
    """Any mismatch between cached and recomputed K/V, or in the model, changes a token."""
    hf, path = save_tiny(arch, tmp_path, seed=11)
    config = TEST_CONFIG.with_changes(model_path=str(path))
    core = EngineCore(config, compute=TorchCompute(config)).start()
    rng = random.Random(5)
    prompt = [rng.randrange(256) for _ in range(150)]
    output: list[int] = []
    cached = []
    try:
        for turn, next_prompt in enumerate([None, *_turns(rng)]):
            if next_prompt is not None:
                prompt = next_prompt(prompt, output)
            call = GenerateCall(f"{arch}-t{turn}", tuple(prompt), greedy(NEW_TOKENS), "conv")
            outputs = run_call(core, call)
            output = tokens_of(outputs)
            assert output == hf_greedy(hf, prompt, NEW_TOKENS), f"turn {turn}"
            cached.append(final(outputs).usage.cached_tokens)
        core.check_integrity()
    finally:
        core.stop()
    assert cached[0] == 0 and all(count > 0 for count in cached[1:]), cached


def test_fleet_model_settings_reach_the_engine(tmp_path):
    """engine.yaml's model.config (the chart's free-form model settings) must be read, and an
    unknown key refused, not dropped."""
    from kvfleet.services.engine.compute.compute_types import resolve_model_config
    from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict

    _, path = save_tiny("Qwen3ForCausalLM", tmp_path, seed=1)
    data = {"model": {"name": "q", "path": str(path),
                      "config": {"dtype": "bfloat16", "max_model_len": 300}}}  # fmt: skip
    config = engine_config_from_dict(data)
    assert (config.dtype, config.max_model_len) == ("bfloat16", 300)
    assert resolve_model_config(config).max_position == 300
    compute = TorchCompute(config)
    assert next(compute.model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"model.config.quantization: unknown key"):
        engine_config_from_dict({"model": {"name": "q", "config": {"quantization": "fp8"}}})
    with pytest.raises(ValueError, match="max_model_len 4096 exceeds the model's context"):
        resolve_model_config(config.with_changes(max_model_len=4096))
