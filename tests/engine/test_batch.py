"""Batch layout (positions, slots, page tables) and validation of bad chunks."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import small_config
from kvfleet.kvstore.block_pool import IntegrityError
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.kv.kv_cache import PagedKVCache


def _cache(window=4, pages=10, page_size=4):
    return PagedKVCache(small_config(window=window), pages, page_size)


def test_layout_of_a_mixed_batch():
    """Wrong positions or slots would write K/V to the wrong place."""
    cache = _cache()
    batch = ForwardBatch.build(
        [
            SequenceChunk([5, 6], 3, {"full": [2, 7], "window": [3, 8]}),
            SequenceChunk([9], 0, {"full": [4], "window": [5]}),
        ],
        cache,
    )
    assert batch.positions.tolist() == [3, 4, 0]
    assert batch.slots["full"].tolist() == [2 * 4 + 3, 7 * 4 + 0, 4 * 4]
    assert batch.slots["window"].tolist() == [3 * 4 + 3, 8 * 4 + 0, 5 * 4]
    meta = batch.attention["full"]
    assert meta.cu_seqlens_q.tolist() == [0, 2, 3]
    assert meta.seqused_k.tolist() == [5, 1]
    assert meta.page_table.tolist() == [[2, 7], [4, 0]]
    assert meta.page_table.dtype == torch.int32
    assert batch.last_token_index.tolist() == [1, 2]


@pytest.mark.parametrize(
    "chunk, message",
    [
        (SequenceChunk([], 0, {"full": [1], "window": [1]}), "no new tokens"),
        (SequenceChunk([1] * 5, 0, {"full": [1], "window": [1, 2]}), "1 pages cover fewer than 5"),
        (SequenceChunk([1], 0, {"full": [10], "window": [1]}), r"page ids \[10\] outside 0..9"),
        (SequenceChunk([1], 0, {"full": [1]}), "no page ids for layer group 'window'"),
        (SequenceChunk([99], 0, {"full": [1], "window": [1]}), r"token ids \[99\] outside 0..63"),
        (SequenceChunk([1], 4, {"full": [1, 0], "window": [1, 2]}), "include the null page 0"),
        (SequenceChunk([1], 4, {"full": [0, 1], "window": [1, 2]}), "include the null page 0"),
        (SequenceChunk([1], 600, {"full": [1], "window": [1]}), "max_position 512"),
    ],
)
def test_bad_chunks_are_refused(chunk, message):
    """A bad chunk must raise ValueError with its numbers, never corrupt the cache."""
    with pytest.raises(ValueError, match=message):
        ForwardBatch.build([chunk], _cache())


def test_window_group_may_null_pages_before_the_window():
    """kvstore frees window pages that slid out; the batch must accept them as null."""
    cache = _cache(window=4)
    chunk = SequenceChunk([1], 12, {"full": [1, 2, 3, 4], "window": [0, 0, 3, 4]})
    assert ForwardBatch.build([chunk], cache).attention["window"].page_table.tolist() == [
        [0, 0, 3, 4]
    ]


def test_window_page_inside_the_window_must_not_be_null():
    """Position 12 with window 4 reads 9..12, so page 2 (positions 8..11) is needed."""
    cache = _cache(window=4)
    chunk = SequenceChunk([1], 12, {"full": [1, 2, 3, 4], "window": [0, 0, 0, 4]})
    with pytest.raises(ValueError, match="include the null page 0"):
        ForwardBatch.build([chunk], cache)


def test_cache_shapes_follow_the_config():
    """Each layer's pages must be [num_pages, page_size, kv_heads, head_dim]."""
    config = preset("tiny")
    cache = PagedKVCache(config, 5, 16)
    k, v = cache.kv(1)
    assert k.shape == v.shape == (5, 16, config.num_kv_heads, config.head_dim)
    assert cache.group_of(1) == "window" and cache.group_of(0) == "full"
    assert cache.bytes_per_token() == 3 * 2 * 2 * 16 * 4


def test_integrity_check_catches_a_write_to_the_null_page():
    """The null page is shared by every nulled entry; writing it would corrupt others."""
    cache = _cache()
    cache.kv(0)[0][0, 0, 0, 0] = 1.0
    with pytest.raises(IntegrityError, match="null page 0 holds 1 non-zero values"):
        cache.check_integrity()
