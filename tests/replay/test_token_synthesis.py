"""Token synthesis: same block key, same tokens; exact prompt lengths; no accidental sharing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.services.replay.model import Turn
from kvfleet.services.replay.tokens import TokenSynthesizer


def _turn(ids: tuple[int, ...], input_tokens: int, block_size: int, index: int = 0) -> Turn:
    return Turn(index, 0.0, 0.0, input_tokens, 1, ids, "ns", block_size)


def _common_prefix(a: list[int], b: list[int]) -> int:
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length


@settings(max_examples=50, deadline=None)
@given(
    blocks=st.integers(0, 6),
    block_size=st.sampled_from([4, 64, 512]),
    extra=st.integers(-3, 70),
)
def test_turn_has_exactly_input_tokens(blocks: int, block_size: int, extra: int) -> None:
    """If this fails, a replayed prompt is longer or shorter than the trace says."""
    input_tokens = max(1, blocks * block_size + extra)
    blocks = min(blocks, -(-input_tokens // block_size))
    turn = _turn(tuple(range(blocks)), input_tokens, block_size)
    tokens = TokenSynthesizer(seed=7, vocab_size=1000).turn_tokens("c", turn)
    assert len(tokens) == input_tokens
    assert all(0 <= t < 1000 for t in tokens)


def test_same_key_same_tokens_anywhere() -> None:
    """If this fails, equal trace prefixes reach the cache as different tokens."""
    synth = TokenSynthesizer(seed=3, vocab_size=50_000)
    first = synth.turn_tokens("a", _turn((1, 2), 150, 64))
    later = synth.turn_tokens("b", _turn((1, 2, 5), 200, 64, index=4))
    assert (
        first[:128]
        == later[:128]
        == synth.block_tokens(("ns", 1), 64) + synth.block_tokens(("ns", 2), 64)
    )


def test_seed_changes_tokens_and_repeats_them() -> None:
    """If this fails, --seed does not make a run repeatable, or all seeds look alike."""
    turn = _turn((1,), 64, 64)
    assert TokenSynthesizer(1, 32000).turn_tokens("c", turn) == TokenSynthesizer(
        1, 32000
    ).turn_tokens("c", turn)
    assert TokenSynthesizer(1, 32000).turn_tokens("c", turn) != TokenSynthesizer(
        2, 32000
    ).turn_tokens("c", turn)


def test_rehashed_partial_block_shares_no_token() -> None:
    """If this fails, an engine reuses part of a re-hashed Mooncake block the oracle excludes."""
    synth = TokenSynthesizer(seed=0, vocab_size=32000)
    earlier = synth.turn_tokens("c", _turn((10, 11), 700, 512))  # block 11 holds 188 tokens
    later = synth.turn_tokens("c", _turn((10, 12, 13), 1300, 512, index=1))  # 11 re-hashed: 12
    assert _common_prefix(earlier, later) == 512


def test_tail_after_blocks_is_unique_per_turn() -> None:
    """If this fails, a resent prompt reuses tokens past its full blocks (beyond the oracle)."""
    synth = TokenSynthesizer(seed=0, vocab_size=32000)
    first = synth.turn_tokens("c", _turn((1,), 100, 64, index=0))
    resent = synth.turn_tokens("c", _turn((1,), 100, 64, index=1))
    assert _common_prefix(first, resent) == 64


def test_rejects_empty_vocab_range() -> None:
    """If this fails, a bad vocab size yields tokens the model cannot embed."""
    with pytest.raises(ValueError, match="first_id=10"):
        TokenSynthesizer(seed=0, vocab_size=10, first_id=10)
