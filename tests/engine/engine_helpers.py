"""Engine test helpers: tiny configs and random paged layouts."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.config.model_config import ModelConfig
from kvfleet.services.engine.kv.kv_cache import PagedKVCache

torch.set_num_threads(1)


def small_config(window: int | None = 8, **changes) -> ModelConfig:
    """Three layers, the middle one a sliding window of `window` positions (None: none)."""
    fields = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        max_position=512,
        name="test",
        window_layers=(1,) if window else (),
        window_size=window or 0,
    )
    return ModelConfig(**{**fields, **changes})


def attention_config(window: int | None) -> ModelConfig:
    """One layer, in the window group when `window` is set."""
    return small_config(window=window, num_layers=1, window_layers=(0,) if window else ())


def paged_case(
    spec: Sequence[tuple[int, int]],
    page_size: int,
    window: int | None = None,
    seed: int = 0,
    null_before_window: bool = True,
):
    """(cache, meta, q) for sequences `[(num_cached, num_new), ...]` on shuffled pages."""
    gen = torch.Generator().manual_seed(seed)
    config = attention_config(window)
    per_seq = [math.ceil((c + n) / page_size) for c, n in spec]
    cache = PagedKVCache(config, sum(per_seq) + 1, page_size)
    k_pages, v_pages = cache.kv(0)
    k_pages[1:] = torch.randn(k_pages[1:].shape, generator=gen)
    v_pages[1:] = torch.randn(v_pages[1:].shape, generator=gen)
    order = (torch.randperm(sum(per_seq), generator=gen) + 1).tolist()
    group = next(iter(cache.num_pages))
    chunks, start = [], 0
    for (cached, new), count in zip(spec, per_seq, strict=True):
        pages = order[start : start + count]
        start += count
        if window and null_before_window:
            first_read = max(0, cached - window + 1) // page_size
            pages = [0] * first_read + pages[first_read:]
        chunks.append(SequenceChunk([1] * new, cached, {group: pages}))
    batch = ForwardBatch.build(chunks, cache)
    q = torch.randn(int(batch.token_ids.numel()), config.num_heads, config.head_dim, generator=gen)
    return cache, batch.attention[group], q
