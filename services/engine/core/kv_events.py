"""KV events with the tokens the router needs to key blocks (`parent, block tokens`).

The kvstore manager reports only block hashes; this tracker keeps each live sequence's block
hashes next to their tokens, so a `stored` event can carry its parent hash and tokens. Only
the full-prefix life cycle is forwarded: window pools hold the same block ids again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat

from ....kvstore.events import KVEvent, KVEventKind
from ....kvstore.hashing import SequenceHashes, pack_tokens
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
    """Tokens and parents of the blocks of live sequences (core thread only).

    A sequence's block ids and tokens are a `SequenceHashes` (its packed tokens and chained
    ids): the kvstore's own, where `hashes_of` names the manager's record of a key (the
    engine: its prompt is hashed once, by the kvstore, and every token it samples is appended
    there first), else one kept here. Which block id is which sequence's block is looked up
    only when a `stored` event needs it (`translate`), and a block's tokens are read only for
    such an event: a resent prompt whose prefix is cached stores few blocks.
    """

    def __init__(
        self,
        block_size: int,
        hashes_of: Callable[[str], SequenceHashes | None] | None = None,
    ) -> None:
        self.block_size = block_size
        self._hashes_of = hashes_of
        self._sequences: dict[str, SequenceHashes] = {}
        self._indexed: dict[str, int] = {}  # blocks of each live sequence put in `_blocks`
        # block id -> (the sequence that holds it, its index there)
        self._blocks: dict[int, tuple[SequenceHashes, int]] = {}
        self._retired: list[SequenceHashes] = []

    def extend(self, key: str, token_ids: Sequence[int], extra_key: bytes = b"") -> None:
        """Add tokens to a sequence (`extra_key`, the cache salt, counts when the sequence is
        new). With `hashes_of` the kvstore's record of the key holds them already."""
        shared = self._hashes_of(key) if self._hashes_of is not None else None
        if shared is not None:
            self._track(key, shared)
            return
        if key not in self._sequences:
            self._track(key, SequenceHashes(self.block_size, extra_key))
        self._sequences[key].extend(token_ids)

    def extend_all(self, keys: Sequence[str], token_ids: Sequence[int]) -> None:
        """`extend(key, [token])` for each tracked sequence and its one token (a decode step's
        tokens)."""
        if self._hashes_of is not None:
            return  # appended to the kvstore's records (`append_tokens_all`) already
        sequences = [self._sequences[key] for key in keys]
        SequenceHashes.extend_each(sequences, pack_tokens(token_ids))

    def _track(self, key: str, sequence: SequenceHashes) -> None:
        if self._sequences.get(key) is not sequence:
            self._sequences[key] = sequence
            self._indexed.setdefault(key, 0)

    def retire(self, key: str) -> None:
        """Forget a sequence: its key may start a new sequence at once (a client reuses a
        request id), while its blocks keep their tokens until the next `translate` (its last
        commits may still report)."""
        sequence = self._sequences.pop(key, None)
        indexed = self._indexed.pop(key, 0)
        if sequence is not None:
            self._index(sequence, indexed)
            self._retired.append(sequence)

    def translate(self, events: Sequence[KVEvent]) -> list[BlockEvent]:
        """Events of the full life cycle, with tokens on `stored` ones we can name."""
        out = []
        indexed = False
        for event in events:
            if event.life_cycle != FULL_GROUP:
                continue
            if event.kind == KVEventKind.STORED:
                if not indexed:
                    self._index_live()
                    indexed = True
                known = self._blocks.get(event.block_hash)
                if known is not None:
                    sequence, index = known
                    tokens = sequence.block_tokens(index)
                    if index == 0:
                        root = sequence.root
                        out.append(BlockEvent(event.kind, event.block_hash, None, tokens, root))
                    else:
                        parent = sequence.hashes[index - 1]
                        out.append(BlockEvent(event.kind, event.block_hash, parent, tokens))
            else:
                out.append(BlockEvent(event.kind, event.block_hash))
        self._forget_retired()
        return out

    def _index_live(self) -> None:
        """Put the blocks live sequences completed since the last look in `_blocks` (the
        kvstore may have replaced a record: a preempted sequence is tracked anew)."""
        hashes_of = self._hashes_of
        for key, sequence in list(self._sequences.items()):
            if hashes_of is not None:
                current = hashes_of(key)
                if current is not None and current is not sequence:
                    self._sequences[key] = sequence = current
            self._indexed[key] = self._index(sequence, self._indexed[key])

    def _index(self, sequence: SequenceHashes, start: int) -> int:
        hashes = sequence.hashes
        end = len(hashes)
        if start < end:
            self._blocks.update(
                zip(hashes[start:], zip(repeat(sequence), range(start, end)), strict=True)
            )
        return end

    def _forget_retired(self) -> None:
        if not self._retired:
            return
        live = {h for sequence in self._sequences.values() for h in sequence.hashes}
        for sequence in self._retired:
            for block_hash in sequence.hashes:
                if block_hash not in live:
                    self._blocks.pop(block_hash, None)
        self._retired.clear()
