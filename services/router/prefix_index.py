"""Which prompt prefixes each rank holds, learnt from the ranks' KV events.

Engines name blocks by their own hash; the router re-keys every stored block by a chained hash
of its tokens (`parent key, tokens`), so it can hash a new prompt the same way without knowing
the engine's hash function. A chain starts at its sequence's root id, which the tenant's cache
salt changes (kvstore `root_hash`): two tenants' equal prompts get different keys, so where one
tenant's prefix lives never steers (nor, by which rank answers, shows itself to) the other.
The router's gRPC layer is the only writer; placement reads. Each call locks the index (KV
event streams and the admission pass run on different threads).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...kvstore.hashing import root_hash, salt_extra_key

UNSALTED_ROOT = root_hash()


def prompt_root(cache_salt: str) -> int:
    """The root id a request's blocks chain from: the engine's, for the same cache salt."""
    return root_hash(salt_extra_key(cache_salt))


def chain_keys(tokens: Sequence[int], block_size: int, root: int = UNSALTED_ROOT) -> list[int]:
    """Chained keys of the full blocks of `tokens` from `root` (a partial last block has
    none)."""
    keys = []
    parent = root
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        keys.append(parent)
    return keys


@dataclass
class _RankBlocks:
    engine_to_key: dict[int, int] = field(default_factory=dict)
    key_counts: dict[int, int] = field(default_factory=dict)


class PrefixIndex:
    """Per-rank sets of block keys; `overlap` counts the leading prompt blocks a rank holds."""

    def __init__(self) -> None:
        self._ranks: dict[str, _RankBlocks] = {}
        self._lock = threading.RLock()

    def atomically(self, apply: Callable[[PrefixIndex], object]) -> object:
        """Run several changes as one step."""
        with self._lock:
            return apply(self)

    def stored(
        self,
        rank_id: str,
        block_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        root: int | None = None,
    ) -> int:
        """Record blocks a rank stored; returns how many were indexed. `root`: with no parent,
        the sequence's root id (None: unsalted).

        Blocks whose parent the index never saw cannot be keyed and are skipped.
        """
        if len(token_ids) != len(block_hashes) * block_size:
            raise ValueError(
                f"token_ids: {len(token_ids)} tokens for {len(block_hashes)} blocks of {block_size}"
            )
        with self._lock:
            return self._stored(rank_id, block_hashes, parent_hash, token_ids, block_size, root)

    def _stored(self, rank_id, block_hashes, parent_hash, token_ids, block_size, root) -> int:
        blocks = self._ranks.setdefault(rank_id, _RankBlocks())
        if parent_hash is None:
            parent_key = UNSALTED_ROOT if root is None else root
        elif parent_hash in blocks.engine_to_key:
            parent_key = blocks.engine_to_key[parent_hash]
        else:
            return 0
        for i, engine_hash in enumerate(block_hashes):
            chunk = tuple(token_ids[i * block_size : (i + 1) * block_size])
            parent_key = hash((parent_key, chunk))
            if engine_hash not in blocks.engine_to_key:
                blocks.engine_to_key[engine_hash] = parent_key
                blocks.key_counts[parent_key] = blocks.key_counts.get(parent_key, 0) + 1
        return len(block_hashes)

    def removed(self, rank_id: str, block_hashes: Sequence[int]) -> None:
        """Forget blocks a rank evicted."""
        with self._lock:
            self._removed(rank_id, block_hashes)

    def _removed(self, rank_id: str, block_hashes: Sequence[int]) -> None:
        blocks = self._ranks.get(rank_id)
        if blocks is None:
            return
        for engine_hash in block_hashes:
            key = blocks.engine_to_key.pop(engine_hash, None)
            if key is None:
                continue
            remaining = blocks.key_counts[key] - 1
            if remaining:
                blocks.key_counts[key] = remaining
            else:
                del blocks.key_counts[key]

    def clear(self, rank_id: str) -> None:
        """Forget everything about a rank (cleared cache, or rank removed)."""
        with self._lock:
            self._ranks.pop(rank_id, None)

    def overlap(self, rank_id: str, prompt_keys: Sequence[int]) -> int:
        """Leading blocks of the prompt (as chained keys) that the rank holds."""
        with self._lock:
            blocks = self._ranks.get(rank_id)
            if blocks is None:
                return 0
            count = 0
            for key in prompt_keys:
                if key not in blocks.key_counts:
                    break
                count += 1
            return count

    def block_count(self, rank_id: str) -> int:
        """Blocks indexed for a rank."""
        with self._lock:
            blocks = self._ranks.get(rank_id)
            return len(blocks.engine_to_key) if blocks else 0
