"""An fp8 (e4m3) KV cache: quantized writes, dequantized reads, scales, greedy agreement."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import paged_case, small_config
from kvfleet.services.engine.attention.attn_flash import gather_dequantized
from kvfleet.services.engine.attention.attn_reference import dense_attention, gather_pages
from kvfleet.services.engine.attention.backends import make_backend
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.compute.generation import generate
from kvfleet.services.engine.kv.kv_cache import PagedKVCache
from kvfleet.services.engine.kv.kv_calibration import calibrate_kv_scales
from kvfleet.services.engine.kv.kv_quant import FP8_DTYPE, FP8_MAX, KVScales
from kvfleet.services.engine.model.weights import build_model
from kvfleet.services.engine.request.sampling_params import SamplingParams

SCALE = 8**-0.5
FP8 = torch.float8_e4m3fn
# Per KV head, K and V scales of the one attention layer (not 1, so a reader that skips
# them reads other values).
HEAD_SCALES = torch.tensor([[[0.25, 2.0], [0.5, 0.125]]])
CASES = {
    "prefill": ([(0, 13), (0, 40)], None),
    "decode": ([(c, 1) for c in (0, 1, 7, 9, 50)], None),
    "mixed batch, window layer": ([(45, 1), (20, 12), (0, 9), (16, 1)], 5),
}


def fp8_case(spec, page_size, window, seed=0):
    """`paged_case`'s pages quantized into an fp8 cache with `HEAD_SCALES`."""
    cache, meta, q = paged_case(spec, page_size, window, seed=seed)
    group = cache.group_of(0)
    scales = KVScales({group: HEAD_SCALES})
    fp8 = PagedKVCache(cache.config, cache.num_pages[group], page_size, dtype=FP8, scales=scales)
    for source, target, scale in zip(cache.kv(0), fp8.kv(0), HEAD_SCALES[0], strict=True):
        target.copy_((source / scale[:, None]).to(FP8))
    return fp8, meta, q


def dequantized_reference(cache, meta, q, window, sinks=None):
    """Dense fp32 attention over each sequence's pages read as `stored * scale` (with `sinks`:
    each head's sink column added after that dequantization)."""
    k_scale, v_scale = cache.kv_scales(0)
    k_pages, v_pages = (pages.float() for pages in cache.kv(0))
    out, start = [], 0
    for b, (n, ctx) in enumerate(zip(meta.query_lens, meta.context_lens, strict=True)):
        k = gather_pages(k_pages, meta.page_table[b], ctx) * k_scale[:, None]
        v = gather_pages(v_pages, meta.page_table[b], ctx) * v_scale[:, None]
        positions = torch.arange(ctx - n, ctx)
        out.append(dense_attention(q[start : start + n], k, v, positions, window, SCALE, sinks))
        start += n
    return torch.cat(out)


def flash_path_on_cpu(q, k_pages, v_pages, meta, window, scale, kv_scales):
    """The flash backend's fp8 read (gather + dequantize, local page table) with the
    reference kernel in flash-attn's place."""
    k, v, local = gather_dequantized(k_pages, v_pages, meta, kv_scales, q.dtype)
    return make_backend("reference", "cpu").forward(q, k, v, local, window, scale)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "flash gather"])
@pytest.mark.parametrize("case", list(CASES))
def test_fp8_paged_attention_equals_dequantized_reference(backend, case):
    """A backend that read fp8 pages without their scales would serve other tokens."""
    spec, window = CASES[case]
    cache, meta, q = fp8_case(spec, 4, window)
    k_pages, v_pages = cache.kv(0)
    args = (q, k_pages, v_pages, meta, window, SCALE)
    if backend == "flash gather":
        out = flash_path_on_cpu(*args, kv_scales=cache.kv_scales(0))
    else:
        out = make_backend(backend, "cpu").forward(*args, kv_scales=cache.kv_scales(0))
    expected = dequantized_reference(cache, meta, q, window)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    cache.check_integrity()


def test_write_stores_values_over_the_scale():
    """Writes must quantize `x / scale` per head: read back within e4m3's rounding, and values
    past the range saturate instead of turning into NaN."""
    config = small_config(window=None, num_layers=1)
    scales = KVScales({"full": HEAD_SCALES})
    cache = PagedKVCache(config, 4, 4, dtype=FP8, scales=scales)
    k = torch.randn(8, 2, 8, generator=torch.Generator().manual_seed(0))
    v = k.clone()
    v[0, 0, 0] = 1e6  # past 448 x 0.5
    cache.write(0, k, v, torch.arange(4, 12))
    k_pages, v_pages = cache.kv(0)
    k_back = k_pages.float().flatten(0, 1)[4:12] * HEAD_SCALES[0, 0][:, None]
    v_back = v_pages.float().flatten(0, 1)[4:12] * HEAD_SCALES[0, 1][:, None]
    # e4m3: 3 mantissa bits, relative error <= 2^-4 for normals; absolute below them
    tolerance = (k.abs() * 2**-4).clamp_min(2**-9 * HEAD_SCALES[0, 0].max())
    assert bool(((k_back - k).abs() <= tolerance).all())
    assert v_back[0, 0, 0] == FP8_MAX * HEAD_SCALES[0, 1, 0]
    cache.check_integrity()


def test_scales_are_only_for_an_fp8_cache():
    """Scales given to a bf16/fp32 cache would be silently ignored: refuse them."""
    config = small_config(window=None, num_layers=1)
    with pytest.raises(ValueError, match="fp8 cache"):
        PagedKVCache(config, 4, 4, scales=KVScales({"full": HEAD_SCALES}))
    assert PagedKVCache(config, 4, 4).kv_scales(0) is None
    assert torch.equal(PagedKVCache(config, 4, 4, dtype=FP8).kv_scales(0)[0], torch.ones(2))


def test_calibrated_scales_are_powers_of_two_with_headroom():
    """Scales must fit the model's K/V range (or values saturate) and be powers of two (so
    every pod computes the same ones and scaling is exact)."""
    config = small_config(window=8)
    model = build_model(config, seed=3)
    scales = calibrate_kv_scales(model, config.groups, torch.device("cpu"))
    amax = model.kv_amax(torch.arange(64) % config.vocab_size)
    for group, layers in config.groups.items():
        group_scales = scales.group(group)
        assert torch.equal(group_scales, torch.exp2(torch.log2(group_scales).round()))
        assert bool((amax[list(layers)] <= group_scales * FP8_MAX).all())
    again = calibrate_kv_scales(model, config.groups, torch.device("cpu"))
    assert scales.tag() == again.tag() != ""


def _greedy(model, config, dtype, prompt, scales=None):
    cache = PagedKVCache(config, 40, 4, dtype=dtype, scales=scales)
    params = SamplingParams(temperature=0.0, max_tokens=48)
    backend = make_backend("reference", "cpu")
    tokens = generate(model, cache, backend, prompt, params, prefill_chunk=16).token_ids
    cache.check_integrity()
    return tokens


def test_fp8_greedy_agreement_with_fp32_kv_is_reported(capsys):
    """Reported, not asserted exactly: fp8 KV rounds K/V, so a tiny random model's near-tied
    logits flip now and then; a low agreement would mean a broken read, not rounding."""
    config = small_config(window=8)
    model = build_model(config, seed=4)
    scales = calibrate_kv_scales(model, config.groups, torch.device("cpu"))
    same_prefix, total, exact = 0, 0, 0
    for seed in range(4):
        prompt = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(seed))
        full = _greedy(model, config, torch.float32, prompt.tolist())
        fp8 = _greedy(model, config, FP8_DTYPE, prompt.tolist(), scales)
        first_diff = next(
            (i for i, (a, b) in enumerate(zip(full, fp8, strict=True)) if a != b), len(full)
        )
        same_prefix += first_diff
        exact += sum(a == b for a, b in zip(full, fp8, strict=True))
        total += len(full)
    with capsys.disabled():
        print(
            f"\nfp8 vs fp32 KV, greedy, 4 prompts x 48 tokens: {same_prefix}/{total} tokens "
            f"before the first difference, {exact}/{total} position-wise equal"
        )
    assert same_prefix >= total // 4


def _run(model, cache, tokens, start, pages, chunk):
    """Prefill `tokens[start:]` in chunks of `chunk`; the last logits."""
    backend = make_backend("reference", "cpu")
    for first in range(start, len(tokens), chunk):
        piece = SequenceChunk(tokens[first : first + chunk], first, pages)
        logits = model(ForwardBatch.build([piece], cache), cache, backend)
    return logits


def _greedy_from(model, cache, tokens, start, chunk, count):
    """Prefill `tokens[start:]` (the KV before `start` is cached), then `count` greedy tokens."""
    pages = {group: list(range(1, 40)) for group in cache.num_pages}
    logits = _run(model, cache, tokens, start, pages, chunk)
    out = []
    for _ in range(count):
        out.append(int(logits[0].argmax()))
        logits = _run(model, cache, [*tokens, *out], len(tokens) + len(out) - 1, pages, 1)
    return out


@pytest.mark.parametrize("turn", ["appended", "resent"])
def test_fp8_greedy_with_cached_prefix_equals_without(turn):
    """Pages a cached prefix reuses (prefill- and decode-written) must hold what a fresh
    prefill writes, or a turn's output would depend on what was cached."""
    config = small_config(window=8)
    model = build_model(config, seed=4)
    scales = calibrate_kv_scales(model, config.groups, torch.device("cpu"))
    prompt = torch.randint(0, 64, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    warm = PagedKVCache(config, 40, 4, dtype=FP8_DTYPE, scales=scales)
    output = _greedy_from(model, warm, prompt, 0, 16, 12)  # KV of all but the last output
    second = [*prompt, *output, 5, 9, 1, 33, 2] if turn == "appended" else prompt
    reused = len(prompt) + len(output) - 1 if turn == "appended" else len(prompt) - 1
    cached = _greedy_from(model, warm, second, reused, 16, 16)
    cold = PagedKVCache(config, 40, 4, dtype=FP8_DTYPE, scales=scales)
    assert cached == _greedy_from(model, cold, second, 0, 64, 16)
    warm.check_integrity()


@pytest.mark.parametrize(
    ("scales", "match"),
    [
        (torch.ones(1, 2), "shape"),
        (torch.ones(1, 3, 2), "shape"),
        (torch.zeros(1, 2, 2), "finite and positive"),
        (torch.full((1, 2, 2), float("inf")), "finite and positive"),
    ],
)
def test_bad_scales_are_refused_naming_the_group(scales, match):
    """A zero or misshapen scale would turn every read of its layer into NaN or garbage."""
    with pytest.raises(ValueError, match=f"group 'full'.*{match}|{match}.*'full'"):
        KVScales({"full": scales})
