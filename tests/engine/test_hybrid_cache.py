"""A hybrid SSM/attention model over the kvstore: resuming from cached K/V and state snapshots
gives the same greedy tokens as recomputing, for appending turns, resends and tail rewrites."""

import pytest
import torch
from kvfleet.kvstore.policies import PerConversation
from kvfleet.services.engine.hybrid_runner import HybridCacheConfig, HybridRunner
from kvfleet.services.engine.models.hybrid import HybridLM, hybrid_8b, hybrid_tiny
from kvfleet.services.engine.models.ssm import SSMState

torch.set_num_threads(1)
DECODE = 6


@pytest.fixture(scope="module")
def model() -> HybridLM:
    torch.manual_seed(0)
    lm = HybridLM(hybrid_tiny()).eval()
    with torch.no_grad():
        for parameter in lm.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.2)  # wide logits: greedy picks with clear margins
    return lm


def prompt_tokens(seed: int, count: int) -> list[int]:
    return torch.randint(0, 320, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def uncached(model: HybridLM, prompt: list[int], cache: HybridCacheConfig) -> list[int]:
    """The same runner with an empty cache: every token recomputed."""
    fresh = HybridRunner(model, PerConversation(3), cache)
    tokens = fresh.generate("r", prompt, "c", DECODE)
    assert fresh.reused["r"] == 0
    return tokens


CACHES = {
    "device": HybridCacheConfig(offsets_from_end=(0, 16)),
    # few device pages and a host tier: snapshots and K/V are offloaded and onboarded
    "host": HybridCacheConfig(pages=24, host_pages=96, offsets_from_end=(0, 16), every_tokens=32),
}


@pytest.mark.parametrize("cache_name", sorted(CACHES))
def test_cached_turns_equal_recomputed_turns(model, cache_name, monkeypatch):
    cache = CACHES[cache_name]
    runner = HybridRunner(model, PerConversation(3), cache)
    onboarded: list[str] = []
    onboard = runner.manager.tiers.onboard

    def spy(life_cycle, pages, blocks):  # calls through: only notes which pools came back
        onboarded.extend([life_cycle] * len(pages))
        return onboard(life_cycle, pages, blocks)

    monkeypatch.setattr(runner.manager.tiers, "onboard", spy)
    first = prompt_tokens(1, 40)
    out1 = runner.generate("t1", first, "c", DECODE)
    assert out1 == uncached(model, first, cache)
    if cache.host_pages:  # other conversations push the turn's pages off the device
        runner.manager.release_conversation("c")
        for other in range(4):
            runner.generate(f"x{other}", prompt_tokens(100 + other, 120), f"x{other}", 1)
            runner.manager.release_conversation(f"x{other}")
    # an appending turn: the last prompt, its answer and a new message
    second = first + out1 + prompt_tokens(2, 21)
    out2 = runner.generate("t2", second, "c", DECODE)
    assert runner.reused["t2"] >= 40
    assert out2 == uncached(model, second, cache)
    if cache.host_pages:  # its state snapshot and K/V came back from the host tier
        assert {"full", "ssm"} <= set(onboarded), onboarded
    # a resend of the same prompt resumes just before its end
    again = runner.generate("t3", second, "c", DECODE)
    assert runner.reused["t3"] == (len(second) - 1) // 8 * 8
    assert again == out2
    # a tail rewrite: the last 16 tokens replaced resumes at the from-end snapshot
    rewrite = second[:-16] + prompt_tokens(3, 16)
    out4 = runner.generate("t4", rewrite, "c", DECODE)
    assert runner.reused["t4"] == (len(second) - 16) // 8 * 8
    assert out4 == uncached(model, rewrite, cache)


def test_a_restored_state_continues_like_the_unbroken_scan(model):
    """The scan from a snapshot equals the scan through it (the rule snapshots rely on)."""
    layer = model.layers[0].mixer
    x = torch.randn(12, 64)
    whole, end, kept = layer(x, SSMState.zeros(layer.shape), frozenset({4}))
    resumed = SSMState.from_flat(layer.shape, kept[4].flat())
    tail, end_resumed, _ = layer(x[5:], resumed)
    torch.testing.assert_close(tail, whole[5:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(end_resumed.ssm, end.ssm)


def test_a_state_larger_than_a_page_is_refused_by_name():
    with torch.device("meta"):  # the 8b shape's parameters, never allocated
        big = HybridLM(hybrid_8b())
    with pytest.raises(ValueError, match="SSM state of 537344 floats does not fit a page"):
        HybridRunner(big, PerConversation(3), HybridCacheConfig(page_size=16))
