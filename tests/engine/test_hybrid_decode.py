"""The hybrid model's batched SSM decode step: one set of tensor ops for every decoding
sequence equals stepping each sequence on its own, in the eager forward, in a mixed batch and
on the static-buffer path that CUDA graphs replay."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from engine_testkit import final, shared_compute, tokens_of
from engine_testkit import greedy as plain_greedy
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.compute.cuda_graphs import DecodeRunner
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.model.paged_ssm import SSMBatchPlan
from kvfleet.services.engine.request.engine_request import GenerateCall

PAGE = 16
CONFIG = EngineConfig(
    model="hybrid-tiny",
    max_batch_size=4,
    max_num_batched_tokens=48,
    page_size=PAGE,
    kv_pages=160,
    checkpoint_margin_tokens=32,
    state_offsets_from_end=(0, 32),
    decode_graphs="off",
)
STATIC = CONFIG.with_changes(decode_graphs="static", overlap_decode=True)


def _ssm_layers(model) -> list[int]:
    return list(model.config.ssm_layers)


def _pages(first: int, tokens: int) -> list[int]:
    return list(range(first, first + -(-tokens // PAGE)))


def _chunk(tokens, start: int, pages: list[int], cache) -> SequenceChunk:
    return SequenceChunk(tuple(tokens), start, dict.fromkeys(cache.num_pages, tuple(pages)))


class _Cache:
    """The forward's view of `cache` whose states are a copy: two paths from one starting
    point, each writing its own state pages."""

    def __init__(self, cache, layers: list[int]) -> None:
        self._cache = cache
        self.copies = {layer: cache.states(layer).clone() for layer in layers}

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def states(self, layer: int) -> torch.Tensor:
        return self.copies[layer]


def test_batched_step_equals_the_per_sequence_recurrence(monkeypatch):
    """A mixed step (decodes at positions on and off block ends, one from another sequence's
    snapshot, one first token, and a prefill chunk) must give the logits and state pages of
    stepping every sequence alone; a wrong state index would move both."""
    compute = shared_compute(CONFIG, "hybrid-decode-unit")
    compute.open_tiers()
    cache, model, backend = compute.cache, compute.model, compute.attention
    rng = random.Random(1)
    prompts = {name: [rng.randrange(256) for _ in range(n)] for name, n in
               (("a", 40), ("b", 32), ("c", 23))}  # fmt: skip
    pages = {"a": _pages(1, 41), "b": _pages(10, 33), "c": _pages(20, 24 + 20)}
    for name, prompt in prompts.items():  # prefills that leave a snapshot at every block end
        batch = ForwardBatch.build([_chunk(prompt, 0, pages[name], cache)], cache)
        model(batch, cache, backend)
    d_pages = [*pages["a"][:2], 30]  # a second turn of "a": resumes from its snapshot at 32
    e_pages = [31]
    step = [
        _chunk([7], 40, pages["a"], cache),  # inside a block: reads and writes one page
        _chunk([8], 32, pages["b"], cache),  # a block start: reads block 1, writes block 2
        _chunk([9], 32, d_pages, cache),  # from "a"'s snapshot after token 31
        _chunk([10], 0, e_pages, cache),  # a first token: the null page's zeros
        _chunk([rng.randrange(256) for _ in range(20)], 23, pages["c"], cache),  # prefill
    ]
    batch = ForwardBatch.build(step, cache)
    layers = _ssm_layers(model)
    batched, each = _Cache(cache, layers), _Cache(cache, layers)
    got = model(batch, batched, backend, all_logits=True)
    monkeypatch.setattr(SSMBatchPlan, "of", SSMBatchPlan.each)
    want = model(batch, each, backend, all_logits=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    written = [30, pages["a"][2], pages["b"][2], 31, *pages["c"][1:]]
    for layer in layers:
        # fp32 noise only: the projections run on B rows against 1 (another matmul blocking)
        torch.testing.assert_close(batched.copies[layer], each.copies[layer], rtol=1e-4,
                                   atol=1e-5)  # fmt: skip
        assert bool(batched.copies[layer][written].any())
        assert not bool(batched.copies[layer][cache.null_page_id].any())


def test_static_decode_rows_read_and_write_the_right_state_pages():
    """The static buffers' READ / WRITE rows (graph inputs) against the eager forward's: three
    sequences padded to four rows, the pad row leaving the null page zero."""
    compute = shared_compute(CONFIG, "hybrid-decode-unit")
    compute.open_tiers()
    cache, model, backend = compute.cache, compute.model, compute.attention
    rng = random.Random(2)

    class Chunk:  # what the scheduler hands the runner
        def __init__(self, token, start, page_ids):
            self.new_tokens, self.start, self.page_ids = (token,), start, page_ids

    chunks, first = [], 1
    for length in (5, 32, 47):
        pages = _pages(first, length + 1)
        first += len(pages)
        prompt = [rng.randrange(256) for _ in range(length)]
        model(ForwardBatch.build([_chunk(prompt, 0, pages, cache)], cache), cache, backend)
        chunks.append(Chunk(rng.randrange(256), length, dict.fromkeys(cache.num_pages, pages)))
    layers = _ssm_layers(model)
    before = {layer: cache.states(layer).clone() for layer in layers}
    inputs = [SequenceChunk(c.new_tokens, c.start, c.page_ids) for c in chunks]
    eager = _Cache(cache, layers)
    expected = model(ForwardBatch.build(inputs, cache), eager, backend)
    runner = DecodeRunner(model, cache, backend, max_batch=4, capture=False)
    logits, _ = runner.run(chunks)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    for layer in layers:
        torch.testing.assert_close(cache.states(layer), eager.copies[layer])
        assert not torch.equal(cache.states(layer), before[layer])
    cache.check_integrity()


def _all_at_once(core: EngineCore, calls: list[GenerateCall]) -> list[list]:
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


def _serve_two_turns(config: EngineConfig, storage: str) -> tuple[list[list], list[int]]:
    """Four conversations at once, two turns each (the second resumes from a snapshot while
    others decode): every output, and each second turn's cached tokens."""
    rng = random.Random(4)
    core = EngineCore(config, compute=shared_compute(config, storage)).start()
    try:
        prompts = [tuple(rng.randrange(256) for _ in range(40 + 23 * i)) for i in range(4)]
        ones = _all_at_once(core, [
            GenerateCall(f"s{i}-t1", p, plain_greedy(10, logprobs=0), f"s{i}")
            for i, p in enumerate(prompts)
        ])  # fmt: skip
        seconds = [
            GenerateCall(f"s{i}-t2", (*p, *tokens_of(ones[i]), *(rng.randrange(256)
                         for _ in range(9 + 5 * i))), plain_greedy(10, logprobs=0), f"s{i}")
            for i, p in enumerate(prompts)
        ]  # fmt: skip
        twos = _all_at_once(core, seconds)
        core.check_integrity()
        core.call_on_core(core.compute.cache.check_integrity)
        return ones + twos, [final(out).usage.cached_tokens for out in twos]
    finally:
        core.stop()


def _logprobs(outputs) -> list[float]:
    return [entry.logprob for output in outputs for entry in output.logprobs]


@pytest.mark.parametrize("mode", ["eager", "static"])
def test_served_tokens_equal_the_per_sequence_path(mode, monkeypatch):
    """Greedy tokens and log probabilities through EngineCore (batched, prefix-cached second
    turns, and on the static path with pad rows) equal those of the per-sequence path."""
    config = STATIC if mode == "static" else CONFIG
    outputs, cached = _serve_two_turns(config, f"hybrid-decode-{mode}")
    assert all(c > 0 for c in cached), cached
    monkeypatch.setattr(SSMBatchPlan, "of", SSMBatchPlan.each)
    reference, ref_cached = _serve_two_turns(CONFIG, "hybrid-decode-each")
    assert cached == ref_cached
    for index, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        assert tokens_of(out) == tokens_of(ref), f"request {index}"
        torch.testing.assert_close(_logprobs(out), _logprobs(ref), rtol=0, atol=1e-4)
