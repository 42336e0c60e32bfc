"""An fp8 KV cache under attention sinks (gpt-oss): pages dequantized first, the sink column
after, on every backend's read path."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import small_config
from kvfleet.services.engine.attention.attn_flash import FlashAttention
from kvfleet.services.engine.attention.attn_reference import gather_pages
from kvfleet.services.engine.attention.backends import make_backend
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.kv.kv_cache import PagedKVCache
from kvfleet.services.engine.model.weights import build_model
from test_fp8_kv import CASES, SCALE, dequantized_reference, fp8_case


def _sinks(heads: int) -> torch.Tensor:
    # About as large as the scores, so the sink takes a visible share of each softmax.
    return torch.randn(heads, generator=torch.Generator().manual_seed(11)) * 2


def _cpu_kernel(q, k_pages, v_pages, *, cu_seqlens_q, seqused_k, page_table, **kw):
    """flash_attn_varlen_func's paged call in fp32 on the CPU: `(out, lse [H, T])`, and like
    the kernel it takes no fp8 K/V."""
    assert k_pages.dtype == v_pages.dtype == q.dtype, "the kernel takes no fp8 K/V"
    left = kw["window_size"][0]
    outs, lses = [], []
    for b in range(len(seqused_k)):
        start, end, ctx = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(seqused_k[b])
        group = q.shape[1] // k_pages.shape[2]
        k = gather_pages(k_pages, page_table[b], ctx).float().repeat_interleave(group, dim=1)
        v = gather_pages(v_pages, page_table[b], ctx).float().repeat_interleave(group, dim=1)
        delta = torch.arange(ctx - (end - start), ctx)[:, None] - torch.arange(ctx)[None, :]
        visible = (delta >= 0) & (delta <= left if left is not None else True)
        scores = torch.einsum("qhd,khd->qhk", q[start:end].float(), k) * kw["softmax_scale"]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        outs.append(torch.einsum("qhk,khd->qhd", scores.softmax(-1), v))
        lses.append(scores.logsumexp(-1))
    return torch.cat(outs).to(q.dtype), torch.cat(lses).t()


def _flash_on_cpu() -> FlashAttention:
    """The flash backend's own `forward` (gather + dequantize, sink correction from the
    log-sum-exp) with `_cpu_kernel` in flash-attn's place."""
    backend = FlashAttention.__new__(FlashAttention)
    backend._kernel, backend.kv_splits, backend.pack_gqa = _cpu_kernel, 1, None
    return backend


@pytest.mark.parametrize("backend", ["reference", "sdpa", "flash"])
@pytest.mark.parametrize("case", list(CASES))
def test_fp8_pages_with_sinks_equal_dequantized_reference_with_sinks(backend, case):
    """A backend that dropped the sinks on an fp8 cache (or the scales under sinks) would
    serve gpt-oss other tokens with `kv_cache_dtype: fp8_e4m3`."""
    spec, window = CASES[case]
    cache, meta, q = fp8_case(spec, 4, window)
    sinks = _sinks(q.shape[1])
    k_pages, v_pages = cache.kv(0)
    impl = _flash_on_cpu() if backend == "flash" else make_backend(backend, "cpu")
    out = impl.forward(
        q, k_pages, v_pages, meta, window, SCALE, sinks=sinks, kv_scales=cache.kv_scales(0)
    )
    expected = dequantized_reference(cache, meta, q, window, sinks)
    assert not torch.allclose(expected, dequantized_reference(cache, meta, q, window))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    cache.check_integrity()


def test_calibration_sees_the_kv_a_sinks_model_writes():
    """Scales are calibrated from `kv_amax`'s dense forward: without the sinks there, every
    layer after the first would be calibrated on K/V the served model never writes."""
    config = small_config(window=None, attention_sinks=True)
    model = build_model(config, seed=5)
    for layer in model.model.layers:  # sinks large enough to move the later layers' K/V
        layer.self_attn.sinks.data = torch.full((config.num_heads,), 3.0)
    prompt = torch.arange(24) % config.vocab_size
    cache = PagedKVCache(config, 8, 4)
    chunk = SequenceChunk(prompt.tolist(), 0, {"full": list(range(1, 7))})
    model(ForwardBatch.build([chunk], cache), cache, make_backend("reference", "cpu"))
    written = torch.stack(
        [
            torch.stack([pages[1:7].abs().amax(dim=(0, 1, 3)) for pages in cache.kv(layer)])
            for layer in range(config.num_layers)
        ]
    )
    torch.testing.assert_close(model.kv_amax(prompt), written)
