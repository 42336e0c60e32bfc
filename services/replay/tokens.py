"""Prompt tokens synthesised per block key, so that a trace's prefix structure reaches the cache.

The same (namespace, id) always gives the same `block_size` tokens for a seed; different keys
give unrelated tokens from the first one on. So a Mooncake block that is re-hashed once its
prompt grows (same position, new id) shares no leading tokens with the partial block it
replaces, and an engine cannot reuse more than the trace's ids allow. Tokens past the last block
are unique to their (conversation, turn).
"""

from __future__ import annotations

import numpy as np
import xxhash

from .model import BlockKey, Turn

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """Finalise 64-bit values so that neighbouring inputs give unrelated outputs."""
    values = values ^ (values >> np.uint64(30))
    values = values * _MIX_1
    values = values ^ (values >> np.uint64(27))
    values = values * _MIX_2
    return values ^ (values >> np.uint64(31))


class TokenSynthesizer:
    """Deterministic token ids in `[first_id, vocab_size)` for block keys and turns."""

    def __init__(self, seed: int, vocab_size: int, first_id: int = 0) -> None:
        if not 0 <= first_id < vocab_size:
            raise ValueError(f"need 0 <= first_id={first_id} < vocab_size={vocab_size}")
        self.seed = seed
        self.vocab_size = vocab_size
        self.first_id = first_id

    def _key_seed(self, label: str) -> int:
        return xxhash.xxh64_intdigest(label.encode(), seed=self.seed & 0xFFFFFFFFFFFFFFFF)

    def _tokens(self, key_seeds: list[int], length: int) -> np.ndarray:
        """A (len(key_seeds), length) array: row r holds the tokens of key r."""
        starts = np.array(key_seeds, dtype=np.uint64)[:, None]
        offsets = (np.arange(1, length + 1, dtype=np.uint64) * _GOLDEN)[None, :]
        mixed = _splitmix64(starts + offsets)
        span = np.uint64(self.vocab_size - self.first_id)
        return (mixed % span).astype(np.int64) + self.first_id

    def block_tokens(self, key: BlockKey, block_size: int) -> list[int]:
        """The `block_size` tokens of one block key."""
        namespace, block_id = key
        return self._tokens([self._key_seed(f"{namespace}\0{block_id}")], block_size)[0].tolist()

    def turn_tokens(self, conversation_id: str, turn: Turn) -> list[int]:
        """Exactly `turn.input_tokens` prompt tokens: the turn's blocks in order (a partial last
        block keeps its key's leading tokens), then tokens unique to this turn."""
        size = turn.block_size
        seeds = [self._key_seed(f"{ns}\0{block_id}") for ns, block_id in turn.block_keys()]
        parts = []
        if seeds:
            parts.append(self._tokens(seeds, size).reshape(-1)[: turn.input_tokens])
        tail = turn.input_tokens - len(seeds) * size
        if tail > 0:
            label = f"tail\0{conversation_id}\0{turn.index}"
            parts.append(self._tokens([self._key_seed(label)], tail)[0])
        return np.concatenate(parts).tolist()
