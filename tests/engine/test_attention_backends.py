"""Every attention backend available here against the fp32 reference, over paged KV."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import paged_case
from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.services.engine.attention.attn_reference import dense_attention, gather_pages
from kvfleet.services.engine.attention.backends import available_backends, make_backend

BACKENDS = [name for name in available_backends("cpu") if name != "reference"]
SCALE = 8**-0.5

CASES = {
    "prefill": ([(0, 13), (0, 40)], None),
    "chunked prefill over cached prefix": ([(37, 16), (5, 3)], None),
    "decode": ([(c, 1) for c in (0, 1, 7, 8, 9, 50)], None),
    "window layer": ([(40, 1), (3, 20), (0, 30)], 8),
    "mixed batch": ([(45, 1), (20, 12), (0, 9), (16, 1)], None),
    "mixed batch, window layer": ([(45, 1), (20, 12), (0, 9), (16, 1)], 5),
}


def _run(name, cache, meta, q, window):
    k, v = cache.kv(0)
    out = make_backend(name, "cpu").forward(q, k, v, meta, window, SCALE)
    cache.check_integrity()
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize("case", list(CASES))
def test_backend_matches_reference(backend, page_size, case):
    """A backend that disagrees with the reference would serve different tokens."""
    spec, window = CASES[case]
    cache, meta, q = paged_case(spec, page_size, window)
    expected = _run("reference", cache, meta, q, window)
    torch.testing.assert_close(
        _run(backend, cache, meta, q, window), expected, atol=1e-5, rtol=1e-5
    )


def test_reference_equals_dense_attention_over_gathered_pages():
    """The reference must read the pages in token order, or every backend test is moot."""
    cache, meta, q = paged_case([(10, 6)], page_size=4)
    k_pages, v_pages = cache.kv(0)
    k = gather_pages(k_pages, meta.page_table[0], 16)
    v = gather_pages(v_pages, meta.page_table[0], 16)
    expected = dense_attention(q, k, v, torch.arange(10, 16), None, SCALE)
    torch.testing.assert_close(_run("reference", cache, meta, q, None), expected)


def test_window_ignores_pages_that_slid_out():
    """Window layers must not read pages before the window (they may be reused or nulled)."""
    spec, window = [(30, 2)], 6
    with_null = paged_case(spec, 4, window, seed=3, null_before_window=True)
    without_null = paged_case(spec, 4, window, seed=3, null_before_window=False)
    for name in ["reference", *BACKENDS]:
        torch.testing.assert_close(
            _run(name, *with_null, window), _run(name, *without_null, window)
        )


def test_window_changes_the_result():
    """A window that is silently ignored would make window layers full attention."""
    cache, meta, q = paged_case([(30, 2)], 4, None)
    full = _run("reference", cache, meta, q, None)
    windowed = _run("reference", cache, meta, q, 6)
    assert not torch.allclose(full, windowed)


def test_unknown_backend_is_refused():
    """A typo in a backend name must fail loudly, not fall back silently."""
    with pytest.raises(ValueError, match="unknown attention backend 'flashy'"):
        make_backend("flashy", "cpu")


def test_auto_pick_on_cpu_is_reference():
    """The CPU default is the reference path (fp32 math)."""
    assert make_backend(None, "cpu").name == "reference"
    assert "flash" not in available_backends("cpu")


@settings(max_examples=25, deadline=None)
@given(
    spec=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=4),
    page_size=st.sampled_from([1, 3, 8]),
    window=st.one_of(st.none(), st.integers(1, 20)),
)
def test_sdpa_matches_reference_on_any_layout(spec, page_size, window):
    """Property: for any batch layout, page size and window, SDPA equals the reference."""
    cache, meta, q = paged_case(spec, page_size, window)
    expected = _run("reference", cache, meta, q, window)
    torch.testing.assert_close(_run("sdpa", cache, meta, q, window), expected, atol=1e-5, rtol=1e-5)
