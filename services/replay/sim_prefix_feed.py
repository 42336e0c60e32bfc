"""The router's prefix index fed from simulated ranks' KV events, as engines publish them."""

from __future__ import annotations

from ...kvstore.events import KVEvent, KVEventKind
from ...kvstore.hashing import block_hashes
from ..router.prefix_index import PrefixIndex
from .sim_request import SimRequest


class PrefixFeed:
    """Turns a rank's KV events into the router's prefix index entries, as an engine would.

    A stored block is keyed by its tokens and its parent, both read from the request whose
    kvstore call committed it; blocks of other origins (none here) are skipped.
    """

    def __init__(self, index: PrefixIndex, block_size: int) -> None:
        self.index = index
        self.block_size = block_size
        self._request: SimRequest | None = None
        self._hashes: list[int] = []
        self._positions: dict[int, int] = {}

    def on_event(self, rank_id: str, request: SimRequest | None, event: KVEvent) -> None:
        """Apply one KV event of `rank_id`, committed while `request` was being served."""
        if event.kind is KVEventKind.REMOVED:
            self.index.removed(rank_id, [event.block_hash])
            return
        if request is None:
            return
        if request is not self._request:
            # NOTE: events come in bursts per request; hash its prompt once per burst.
            self._request = request
            self._hashes = block_hashes(request.tokens, self.block_size)
            self._positions = {h: i for i, h in enumerate(self._hashes)}
        position = self._positions.get(event.block_hash)
        if position is None:
            return
        size = self.block_size
        parent = None if position == 0 else self._hashes[position - 1]
        tokens = request.tokens[position * size : (position + 1) * size]
        self.index.stored(rank_id, [event.block_hash], parent, tokens, size)
