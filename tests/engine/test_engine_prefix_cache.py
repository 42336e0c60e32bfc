"""Greedy output with the prefix cache equals output without it, token for token."""

from __future__ import annotations

import random

import pytest
import torch
from engine_testkit import final, greedy, make_core, run_call, tokens_of
from kvfleet.services.engine.request.engine_request import GenerateCall


def _conversation_turns(first_prompt: list[int], rng: random.Random):
    """Turn kinds of an agent loop: append, resend, rewrite the tail."""

    def append(prompt, output):
        return prompt + output + [rng.randrange(256) for _ in range(37)]

    def resend(prompt, _output):
        return list(prompt)

    def rewrite_tail(prompt, _output):
        return prompt[:-21] + [rng.randrange(256) for _ in range(25)]

    return [append, resend, rewrite_tail, append]


@pytest.mark.parametrize(
    ("policy", "kv_cache_dtype"),
    [
        ("per_conversation", "auto"),
        ("per_request", "auto"),
        ("all_reusable", "auto"),
        ("per_conversation", "fp8_e4m3"),
    ],
)
def test_greedy_output_with_cache_equals_without(policy, kv_cache_dtype):
    """Reused KV (pages, windows, checkpoints) would change what the model computes; in an
    fp8 cache, so would pages quantized otherwise than a fresh prefill quantizes them."""
    from engine_testkit import TEST_CONFIG

    config = TEST_CONFIG.with_changes(reuse_policy=policy, kv_cache_dtype=kv_cache_dtype)
    cached_core = make_core(config)
    fp8 = kv_cache_dtype == "fp8_e4m3"
    assert (cached_core.compute.cache.dtype == torch.float8_e4m3fn) == fp8
    rng = random.Random(7)
    prompt = [rng.randrange(256) for _ in range(150)]
    try:
        cached_counts, output = [], []
        for turn, next_prompt in enumerate([None, *_conversation_turns(prompt, rng)]):
            if next_prompt is not None:
                prompt = next_prompt(prompt, output)
            call = GenerateCall(
                f"{policy}-{kv_cache_dtype}-t{turn}", tuple(prompt), greedy(26), "conv-1"
            )
            with_cache = run_call(cached_core, call)
            fresh_core = make_core(config, storage="fresh")  # an empty cache
            try:
                without = run_call(fresh_core, call)
            finally:
                fresh_core.stop()
            output = tokens_of(with_cache)
            assert output == tokens_of(without), f"turn {turn}"
            assert final(without).usage.cached_tokens == 0
            cached_counts.append(final(with_cache).usage.cached_tokens)
        cached_core.check_integrity()
        assert cached_counts[0] == 0
        assert all(count > 0 for count in cached_counts[1:]), cached_counts
    finally:
        cached_core.stop()
