"""KV events with the tokens the router needs to key blocks (`parent, block tokens`).

The kvstore manager reports only block hashes; this tracker keeps each live sequence's block
hashes next to their tokens, so a `stored` event can carry its parent hash and tokens. Only
the full-prefix life cycle is forwarded: window pools hold the same block ids again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ....kvstore.events import KVEvent, KVEventKind
from ....kvstore.hashing import SequenceHashes
from ..config.model_config import FULL_GROUP


@dataclass(frozen=True)
class BlockEvent:
    """A block stored (with its parent and tokens) or removed on this rank."""

    kind: KVEventKind
    block_hash: int
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    root_hash: int | None = None  # a block with no parent: its sequence's (salted) root


class BlockTokens:
    """Tokens and parents of the blocks of live sequences (core thread only)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._sequences: dict[str, tuple[SequenceHashes, list[int]]] = {}
        # block hash -> (parent hash, or the root id for a first block; is it a first block,
        # tokens)
        self._blocks: dict[int, tuple[int, bool, tuple[int, ...]]] = {}
        self._retired: list[tuple[SequenceHashes, list[int]]] = []

    def extend(self, key: str, token_ids: Sequence[int], extra_key: bytes = b"") -> None:
        """Add tokens to a sequence and remember the blocks they complete (`extra_key`, the
        cache salt, counts when the sequence is new)."""
        if key not in self._sequences:
            self._sequences[key] = (SequenceHashes(self.block_size, extra_key), [])
        hashes, tokens = self._sequences[key]
        tokens.extend(token_ids)
        self._hash_full_blocks(hashes, tokens)

    def extend_all(self, keys: Sequence[str], token_ids: Sequence[int]) -> None:
        """`extend(key, [token])` for each tracked sequence and its one token (a decode step's
        tokens): a token that completes no block is only kept."""
        bs, sequences = self.block_size, self._sequences
        for key, token in zip(keys, token_ids, strict=True):
            hashes, tokens = sequences[key]
            tokens.append(token)
            if len(tokens) % bs == 0:
                self._hash_full_blocks(hashes, tokens)

    def _hash_full_blocks(self, hashes: SequenceHashes, tokens: list[int]) -> None:
        bs = self.block_size
        full = len(tokens) // bs * bs
        if full <= hashes.num_tokens:
            return  # a decode token that completes no block: hashed with its block later
        before = len(hashes.hashes)
        hashes.extend(tokens[hashes.num_tokens : full])
        for index in range(before, len(hashes.hashes)):
            parent = hashes.hashes[index - 1] if index else hashes.root
            self._blocks[hashes.hashes[index]] = (
                parent,
                index == 0,
                tuple(tokens[index * bs : (index + 1) * bs]),
            )

    def retire(self, key: str) -> None:
        """Forget a sequence: its key may start a new sequence at once (a client reuses a
        request id), while its blocks keep their tokens until the next `translate` (its last
        commits may still report)."""
        entry = self._sequences.pop(key, None)
        if entry is not None:
            self._retired.append(entry)

    def translate(self, events: Sequence[KVEvent]) -> list[BlockEvent]:
        """Events of the full life cycle, with tokens on `stored` ones we can name."""
        out = []
        for event in events:
            if event.life_cycle != FULL_GROUP:
                continue
            if event.kind == KVEventKind.STORED:
                known = self._blocks.get(event.block_hash)
                if known is not None:
                    parent, first, tokens = known
                    out.append(
                        BlockEvent(event.kind, event.block_hash, None, tokens, parent)
                        if first
                        else BlockEvent(event.kind, event.block_hash, parent, tokens)
                    )
            else:
                out.append(BlockEvent(event.kind, event.block_hash))
        self._forget_retired()
        return out

    def _forget_retired(self) -> None:
        if not self._retired:
            return
        live = {h for hashes, _ in self._sequences.values() for h in hashes.hashes}
        for hashes, _ in self._retired:
            for block_hash in hashes.hashes:
                if block_hash not in live:
                    self._blocks.pop(block_hash, None)
        self._retired.clear()
