"""The decoder over the paged cache equals the dense full-sequence forward, chunk by chunk."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import small_config
from kvfleet.services.engine.attention.backends import make_backend
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.compute.generation import generate
from kvfleet.services.engine.kv.kv_cache import PagedKVCache
from kvfleet.services.engine.model.weights import build_model
from kvfleet.services.engine.request.sampling_params import SamplingParams

PAGE = 4


def _tokens(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _pages(cache: PagedKVCache, first: int, count: int) -> dict[str, list[int]]:
    return {group: list(range(first, first + count)) for group in cache.num_pages}


def _paged_logits(model, cache, tokens, cuts, backend="reference"):
    """All-token logits of `tokens` fed as chunks that end at `cuts`."""
    pages = _pages(cache, 1, -(-len(tokens) // PAGE))
    pieces, start = [], 0
    for end in [*cuts, len(tokens)]:
        chunk = SequenceChunk(tokens[start:end], start, pages)
        batch = ForwardBatch.build([chunk], cache)
        pieces.append(model(batch, cache, make_backend(backend, "cpu"), all_logits=True))
        start = end
    return torch.cat(pieces)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("cuts", [[], [5], [3, 4, 17, 18, 19], list(range(1, 40))])
def test_chunked_paged_forward_equals_dense(backend, cuts):
    """If chunks differed from one pass, greedy output with a prefix cache would differ."""
    config = small_config(window=8)
    model = build_model(config, seed=1)
    cache = PagedKVCache(config, 16, PAGE)
    tokens = _tokens(40)
    dense = model.forward_dense(torch.tensor(tokens))
    paged = _paged_logits(model, cache, tokens, cuts, backend)
    torch.testing.assert_close(paged, dense, atol=1e-5, rtol=1e-5)
    cache.check_integrity()


def test_mixed_batch_equals_each_sequence_alone():
    """Batching must not leak attention or K/V between sequences."""
    config = small_config(window=6)
    model = build_model(config, seed=2)
    backend = make_backend("reference", "cpu")
    cache = PagedKVCache(config, 40, PAGE)
    a, b = _tokens(30, 1), _tokens(13, 2)
    pages_a, pages_b = _pages(cache, 1, 8), _pages(cache, 20, 4)
    # Prefix of a, then in one step: a's next chunk, b's whole prompt.
    model(ForwardBatch.build([SequenceChunk(a[:21], 0, pages_a)], cache), cache, backend)
    mixed = ForwardBatch.build(
        [SequenceChunk(a[21:], 21, pages_a), SequenceChunk(b, 0, pages_b)], cache
    )
    logits = model(mixed, cache, backend)
    dense_a = model.forward_dense(torch.tensor(a))[-1]
    dense_b = model.forward_dense(torch.tensor(b))[-1]
    torch.testing.assert_close(logits, torch.stack([dense_a, dense_b]), atol=1e-5, rtol=1e-5)
    cache.check_integrity()


def test_window_layer_reads_nothing_before_its_window():
    """Window pages that slid out may be nulled by kvstore; decode must still be exact."""
    config = small_config(window=4)
    model = build_model(config, seed=3)
    backend = make_backend("reference", "cpu")
    cache = PagedKVCache(config, {"full": 16, "window": 16}, PAGE)
    tokens = _tokens(25)
    full_pages, window_pages = list(range(1, 8)), list(range(1, 8))
    model(
        ForwardBatch.build(
            [SequenceChunk(tokens[:24], 0, {"full": full_pages, "window": window_pages})], cache
        ),
        cache,
        backend,
    )
    # Position 24 with window 4 reads positions 21..24: pages 5 and 6 only.
    nulled = [0, 0, 0, 0, 0, *window_pages[5:]]
    step = SequenceChunk(tokens[24:], 24, {"full": full_pages, "window": nulled})
    logits = model(ForwardBatch.build([step], cache), cache, backend)
    expected = model.forward_dense(torch.tensor(tokens))[-1:]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    cache.check_integrity()


def test_greedy_generation_with_cached_prefix_equals_without():
    """Resuming from cached pages must give the same greedy tokens as recomputing."""
    config = small_config(window=8)
    model = build_model(config, seed=4)
    backend = make_backend("reference", "cpu")
    prompt = _tokens(33)
    params = SamplingParams(max_tokens=6)
    cold = generate(
        model, PagedKVCache(config, 16, PAGE), backend, prompt, params, prefill_chunk=64
    )
    warm_cache = PagedKVCache(config, 16, PAGE)
    warm = generate(model, warm_cache, backend, prompt, params, prefill_chunk=7)
    assert warm.token_ids == cold.token_ids
    assert warm.finish_reason == "length"
    warm_cache.check_integrity()


def test_all_logits_rows_follow_token_order():
    """Row i of all_logits must be the i-th new token, else per-token scoring breaks."""
    config = small_config(window=None)
    model = build_model(config, seed=5)
    cache = PagedKVCache(config, 8, PAGE)
    tokens = _tokens(9)
    batch = ForwardBatch.build([SequenceChunk(tokens, 0, _pages(cache, 1, 3))], cache)
    backend = make_backend("reference", "cpu")
    every = model(batch, cache, backend, all_logits=True)
    assert every.shape == (9, 64)
    torch.testing.assert_close(every[-1:], model(batch, cache, backend))
