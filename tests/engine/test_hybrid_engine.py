"""The hybrid SSM/attention model served by EngineCore: greedy output with the prefix cache
(K/V pages plus state snapshots, through batching, chunked prefill and the host tier) equals
output without it, and equals the whole-sequence forward with no cache at all."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from engine_testkit import final, run_call, shared_compute, tokens_of
from engine_testkit import greedy as plain_greedy
from kvfleet.kvstore.tiers.metrics import HOST
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.request.engine_request import GenerateCall

PAGE = 16
REWRITE = 21  # tail tokens a rewrite replaces: within the 32-token from-end snapshot
# A 48-token step budget: 150-token prompts run as chunked prefills of several steps.
CONFIG = EngineConfig(
    model="hybrid-tiny",
    max_batch_size=4,
    max_num_batched_tokens=48,
    page_size=PAGE,
    kv_pages=160,
    checkpoint_margin_tokens=32,
    state_offsets_from_end=(0, 32),
)
# Few device pages and a host tier: a flood pushes a turn's pages (both pools) to host.
WITH_HOST = CONFIG.with_changes(
    max_batch_size=2,
    kv_pages=24,
    kv_pool_pages=(("ssm", 9),),
    host_kv_pages=96,
    reuse_policy="per_request",
)


def greedy(max_tokens: int):
    """Greedy with each token's log probability: a state that is slightly wrong shows there
    even where the argmax survives it."""
    return plain_greedy(max_tokens, logprobs=0)


def _logprobs(outputs) -> list[float]:
    return [entry.logprob for output in outputs for entry in output.logprobs]


def _core(config: EngineConfig, storage: str) -> EngineCore:
    return EngineCore(config, compute=shared_compute(config, storage)).start()


def _fresh(call: GenerateCall, config: EngineConfig = CONFIG) -> list:
    """Every output of `call` from an empty cache: every token recomputed."""
    core = _core(config, "hybrid-fresh")
    try:
        outputs = run_call(core, call)
        assert final(outputs).usage.cached_tokens == 0
        return outputs
    finally:
        core.stop()


def _assert_same(outputs: list, reference: list, what: str) -> None:
    """Same greedy tokens, and log probabilities equal within fp32 noise."""
    assert tokens_of(outputs) == tokens_of(reference), what
    torch.testing.assert_close(
        _logprobs(outputs), _logprobs(reference), rtol=0, atol=1e-4, msg=lambda m: f"{what}: {m}"
    )


def _turns(rng: random.Random):
    """Agent-loop turn kinds: append, resend, rewrite the tail, append."""

    def append(prompt, output):
        return prompt + output + [rng.randrange(256) for _ in range(37)]

    def resend(prompt, _output):
        return list(prompt)

    def rewrite_tail(prompt, _output):
        return prompt[:-REWRITE] + [rng.randrange(256) for _ in range(25)]

    return [append, resend, rewrite_tail, append]


def _resume_point(previous: list[int], prompt: list[int]) -> int:
    """Where a turn after `previous` must resume: the last snapshot boundary (prompt end, or
    32 tokens before it, block-aligned) within the shared prefix, short of the prompt end."""
    shared = next(
        (i for i, (a, b) in enumerate(zip(previous, prompt, strict=False)) if a != b),
        min(len(previous), len(prompt)),
    )
    shared = min(shared, len(prompt) - 1)
    boundaries = [(len(previous) - offset) // PAGE * PAGE for offset in (0, 32)]
    return max((b for b in boundaries if b <= shared), default=0)


def run_agent_turns(core, prompt: list[int], rng: random.Random, tag: str, new_tokens: int,
                    check) -> None:  # fmt: skip
    """`_turns`' agent loop from `prompt` on `core`: each turn's outputs go to `check(turn,
    call, outputs)`, each must resume at `_resume_point`; the kvstore and cache stay whole."""
    output: list[int] = []
    for turn, next_prompt in enumerate([None, *_turns(rng)]):
        previous = prompt
        if next_prompt is not None:
            prompt = next_prompt(prompt, output)
        call = GenerateCall(f"{tag}-t{turn}", tuple(prompt), greedy(new_tokens), "conv")
        outputs = run_call(core, call)
        output = tokens_of(outputs)
        check(turn, call, outputs)
        expected = 0 if turn == 0 else _resume_point(previous, prompt)
        assert final(outputs).usage.cached_tokens == expected, f"turn {turn}"
    core.check_integrity()
    core.call_on_core(core.compute.cache.check_integrity)


@pytest.mark.parametrize("decode", ["off", "static"])
@pytest.mark.parametrize("policy", ["per_conversation", "per_request"])
def test_greedy_output_with_cache_equals_without(policy, decode):
    """A wrong snapshot restored, or attention pages that disagree with it, would change the
    tokens; a missing snapshot would show as a resume point other than the boundary. `static`:
    the decodes through the static buffers CUDA graphs replay, against an eager fresh run."""
    config = CONFIG.with_changes(reuse_policy=policy)
    core = _core(config.with_changes(decode_graphs=decode), f"hybrid-cached-{decode}")
    rng = random.Random(7)
    prompt = [rng.randrange(256) for _ in range(150)]
    try:
        run_agent_turns(core, prompt, rng, policy, 10,
                        lambda turn, call, outputs: _assert_same(
                            outputs, _fresh(call, config), f"turn {turn}"))  # fmt: skip
    finally:
        core.stop()


def test_batched_conversations_equal_one_at_a_time():
    """Several conversations in one batch (mixed prefill chunks and decodes): each sequence's
    SSM layers must read and write only its own state pages."""
    rng = random.Random(3)
    firsts = [tuple(rng.randrange(256) for _ in range(120 + 17 * i)) for i in range(4)]
    core = _core(CONFIG, "hybrid-batched")
    try:
        calls = [GenerateCall(f"b{i}-t1", p, greedy(8), f"b{i}") for i, p in enumerate(firsts)]
        ones = _all_at_once(core, calls)
        seconds = []
        for i, prompt in enumerate(firsts):
            appended = [rng.randrange(256) for _ in range(30)]
            prompt2 = (*prompt, *tokens_of(ones[i]), *appended)
            seconds.append(GenerateCall(f"b{i}-t2", prompt2, greedy(8), f"b{i}"))
        twos = _all_at_once(core, seconds)
        for i, call in enumerate(seconds):
            _assert_same(ones[i], _fresh(calls[i]), f"conversation {i} turn 1")
            _assert_same(twos[i], _fresh(call), f"conversation {i} turn 2")
        core.check_integrity()
    finally:
        core.stop()


def _all_at_once(core: EngineCore, calls: list[GenerateCall]) -> list[list]:
    """Submit every call before reading any output, so the scheduler batches them."""
    handles = [core.submit(call) for call in calls]
    results: list[list] = [[] for _ in calls]

    def read(index: int) -> None:
        results[index] = list(handles[index].outputs(60.0))

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_turn_served_from_host_tier_equals_recompute(monkeypatch):
    """Offload and onboarding must move state pages with the K/V pages they agree with."""
    rng = random.Random(5)
    first = GenerateCall("h-t1", tuple(rng.randrange(256) for _ in range(150)), greedy(8), "h")
    core = _core(WITH_HOST, "hybrid-host")
    onboarded: list[str] = []
    onboard = core.manager.tiers.onboard

    def spy(life_cycle, pages, blocks):  # calls through: only notes which pools came back
        onboarded.extend([life_cycle] * len(pages))
        return onboard(life_cycle, pages, blocks)

    monkeypatch.setattr(core.manager.tiers, "onboard", spy)
    try:
        out1 = tokens_of(run_call(core, first))
        for i in range(5):  # other conversations take every device page
            flood = tuple(rng.randrange(256) for _ in range(300))
            run_call(core, GenerateCall(f"flood-{i}", flood, greedy(2), f"flood-{i}"))
        prompt = (*first.prompt_token_ids, *out1, *(rng.randrange(256) for _ in range(30)))
        second = GenerateCall("h-t2", prompt, greedy(8), "h")
        outputs = run_call(core, second)
        metrics = core.call_on_core(lambda: dict(core.manager.tiers.metrics))
        assert final(outputs).usage.cached_tokens == 144
        assert metrics[HOST].hits == 10, metrics  # 9 K/V blocks and the state snapshot
        assert sorted(onboarded) == ["full"] * 9 + ["ssm"], onboarded
        _assert_same(outputs, _fresh(second, WITH_HOST), "turn 2 from host")
        core.check_integrity()
    finally:
        core.stop()


def test_engine_tokens_equal_the_whole_sequence_forward():
    """Paged attention plus paged states equals the dense forward with no cache at all."""
    rng = random.Random(9)
    prompt = [rng.randrange(256) for _ in range(70)]
    call = GenerateCall("dense", tuple(prompt), greedy(6), "dense")
    engine_tokens = tokens_of(_fresh(call))
    model = shared_compute(CONFIG, "hybrid-fresh").model
    tokens = list(prompt)
    for _ in range(6):
        tokens.append(int(model.forward_dense(torch.tensor(tokens))[-1].argmax()))
    assert engine_tokens == tokens[len(prompt) :]


def test_bf16_kv_state_pages_survive_a_host_round_trip():
    """Under a bf16 K/V cache a state page is fp32 bytes in bf16 storage: a copy to the host
    tier and back that garbled them would change the returning turn's tokens."""
    config = WITH_HOST.with_changes(dtype="bfloat16")
    rng = random.Random(11)
    first = GenerateCall("bf-t1", tuple(rng.randrange(256) for _ in range(150)), greedy(8), "bf")
    core = _core(config, "hybrid-bf16")
    try:
        out1 = tokens_of(run_call(core, first))
        for i in range(5):  # push both pools' pages of the turn to the host tier
            flood = tuple(rng.randrange(256) for _ in range(300))
            run_call(core, GenerateCall(f"bf-flood-{i}", flood, greedy(2), f"bf-flood-{i}"))
        prompt = (*first.prompt_token_ids, *out1, *(rng.randrange(256) for _ in range(30)))
        second = GenerateCall("bf-t2", prompt, greedy(8), "bf")
        outputs = run_call(core, second)
        assert final(outputs).usage.cached_tokens == 144
        assert tokens_of(outputs) == tokens_of(_fresh(second, config))
        core.call_on_core(core.compute.cache.check_integrity)
    finally:
        core.stop()
