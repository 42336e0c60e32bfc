"""Attention sinks (gpt-oss): every backend's sink path against the fp32 reference's."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import paged_case
from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.services.engine.attention.attn_flash import with_sinks
from kvfleet.services.engine.attention.attn_reference import dense_attention, gather_pages
from kvfleet.services.engine.attention.backends import make_backend
from test_attention_backends import CASES, SCALE


def _sinks(heads: int, seed: int = 7) -> torch.Tensor:
    # Logits about as large as the scores, so the sink takes a visible share of each softmax.
    return torch.randn(heads, generator=torch.Generator().manual_seed(seed)) * 2


def _run(name, cache, meta, q, window, sinks):
    k, v = cache.kv(0)
    return make_backend(name, "cpu").forward(q, k, v, meta, window, SCALE, sinks)


@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_sinks_match_reference(page_size, case):
    """SDPA's zero-key sink column must weigh what the reference's extra softmax column does."""
    spec, window = CASES[case]
    cache, meta, q = paged_case(spec, page_size, window)
    sinks = _sinks(q.shape[1])
    expected = _run("reference", cache, meta, q, window, sinks)
    got = _run("sdpa", cache, meta, q, window, sinks)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@settings(max_examples=20, deadline=None)
@given(
    spec=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=4),
    page_size=st.sampled_from([1, 3, 8]),
    window=st.one_of(st.none(), st.integers(1, 20)),
)
def test_sdpa_sinks_match_reference_on_any_layout(spec, page_size, window):
    """Property: for any batch layout, page size and window, SDPA with sinks equals the
    reference with sinks."""
    cache, meta, q = paged_case(spec, page_size, window)
    sinks = _sinks(q.shape[1])
    expected = _run("reference", cache, meta, q, window, sinks)
    got = _run("sdpa", cache, meta, q, window, sinks)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_sinks_take_weight_from_the_keys():
    """A sink is one more softmax column of value zero: the output shrinks by the sink's share,
    and a sink at -inf changes nothing."""
    q = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(1))
    k, v = torch.randn(2, 10, 2, 8, generator=torch.Generator().manual_seed(2))
    positions = torch.arange(7, 10)
    sinks = _sinks(4)
    plain = dense_attention(q, k, v, positions, None, SCALE)
    scores = torch.einsum("qhd,khd->qhk", q, k.repeat_interleave(2, dim=1)) * SCALE
    scores = scores.masked_fill(torch.arange(10)[None, None, :] > positions[:, None, None], -1e30)
    lse = scores.logsumexp(-1)  # [q, H]
    share = torch.exp(lse) / (torch.exp(lse) + torch.exp(sinks)[None, :])
    got = dense_attention(q, k, v, positions, None, SCALE, sinks)
    torch.testing.assert_close(got, plain * share[..., None])
    never = torch.full((4,), float("-inf"))
    torch.testing.assert_close(dense_attention(q, k, v, positions, None, SCALE, never), plain)


def test_flash_lse_correction_equals_reference_sinks():
    """The flash path's correction out * sigmoid(lse - sink), given the sinkless output and its
    log-sum-exp, equals the reference's softmax with the sink column."""
    cache, meta, q = paged_case([(20, 5), (0, 9)], 4, 6)
    sinks = _sinks(q.shape[1])
    k_pages, v_pages = cache.kv(0)
    outs, lses, start = [], [], 0
    for b, (n, ctx) in enumerate(zip(meta.query_lens, meta.context_lens, strict=True)):
        k = gather_pages(k_pages, meta.page_table[b], ctx).repeat_interleave(2, dim=1)
        v = gather_pages(v_pages, meta.page_table[b], ctx).repeat_interleave(2, dim=1)
        positions = torch.arange(ctx - n, ctx)
        delta = positions[:, None] - torch.arange(ctx)[None, :]
        visible = (delta >= 0) & (delta < 6)
        scores = torch.einsum("qhd,khd->qhk", q[start : start + n], k) * SCALE
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        outs.append(torch.einsum("qhk,khd->qhd", scores.softmax(-1), v))
        lses.append(scores.logsumexp(-1))
        start += n
    got = with_sinks(torch.cat(outs), torch.cat(lses), sinks)
    expected = _run("reference", cache, meta, q, 6, sinks)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
