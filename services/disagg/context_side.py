"""The context rank's half of a hand-off: park after prefill, export blocks, expire holds.

Everything here runs on the engine core thread, which owns the manager and the page tables:
`park` from the step that sampled the first token, `export` from a `PullKvBlocks` call (via
`call_on_core`), `tick` once per core loop. A parked request keeps its pages (its manager
request stays open) until it is pulled or its hold expires; either way they are released once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ...kvstore.block_pool import NULL_PAGE
from ...kvstore.hashing import SequenceHashes
from .blocks import NO_HASH, KVBlock, read_pages
from .disk_handoff import DiskHandoff
from .holds import HandoffHolds, Hold

log = logging.getLogger(__name__)

HANDOFF_REASON = "handoff"


class HoldNotFound(LookupError):
    """The request holds no KV on this rank (never parked, pulled already, or expired)."""


class HeldPrefixMismatch(ValueError):
    """The receiver's held prefix is not a prefix of the parked request's prompt."""


def prompt_sequence(
    prompt: tuple[int, ...], block_size: int, extra_key: bytes = b""
) -> SequenceHashes:
    """The prompt's chained hashes, as the manager computes them under the request's extra key
    (its tenant's salt), and its blocks' contents."""
    sequence = SequenceHashes(block_size, extra_key)
    sequence.extend(prompt)
    return sequence


def prompt_hashes(prompt: tuple[int, ...], block_size: int) -> list[int]:
    """Chained hashes of the prompt's full blocks, as the manager computes them."""
    return prompt_sequence(prompt, block_size).hashes


def select_blocks(manager, key: str, hashes: list[int], prompt_len: int, first: int):
    """`{lc: [(index, hash, page)]}` for blocks `first..` of the prompt that this rank has.

    A window block released from the request's table (its checkpoint window, at context end)
    is still found by its hash when it stayed committed.
    """
    num_blocks = -(-prompt_len // manager.config.block_size)
    picked: dict[str, list[tuple[int, int, int]]] = {}
    for name in manager.life_cycles:
        table = manager.page_table(key, name)
        rows = []
        for index in range(first, num_blocks):
            block_hash = hashes[index] if index < len(hashes) else NO_HASH
            page = table[index] if index < len(table) else NULL_PAGE
            if page == NULL_PAGE and block_hash != NO_HASH:
                page = manager.pools[name].lookup(block_hash) or NULL_PAGE
            if page != NULL_PAGE:
                rows.append((index, block_hash, page))
        picked[name] = rows
    return picked


def _contents(sequence: SequenceHashes, index: int, block_hash: int) -> bytes:
    """A full block's contents for its shared disk file; none for the partial last block."""
    return b"" if block_hash == NO_HASH else sequence.contents(index)


def read_selected(
    picked: dict[str, list[tuple[int, int, int]]],
    sequence: SequenceHashes,
    read: Callable[[str, list[int]], list[bytes]],
) -> list[KVBlock]:
    """The blocks `select_blocks` picked, their pages' bytes read by `read(lc, pages)`."""
    blocks = []
    for name, rows in picked.items():
        data = read(name, [page for _, _, page in rows])
        blocks.extend(
            KVBlock(name, index, block_hash, raw, _contents(sequence, index, block_hash))
            for (index, block_hash, _), raw in zip(rows, data, strict=True)
        )
    return blocks


class ContextSide:
    """Parked requests of one context rank and the moves of their blocks."""

    def __init__(self, core, hold_seconds: float, disk: DiskHandoff | None = None) -> None:
        if hold_seconds <= 0:
            raise ValueError(f"handoff_hold_seconds must be > 0, got {hold_seconds}")
        self.core = core
        self.hold_seconds = hold_seconds
        self.disk = disk
        self.holds = HandoffHolds()
        self.metrics = core.metrics.handoff
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="handoff-disk") if disk else None

    @property
    def block_size(self) -> int:
        return self.core.manager.config.block_size

    def park(self, sequence, output) -> None:
        """Keep the request's pages for a pull and finish its stream with `output`."""
        call = sequence.call
        handle = self.core.detach(call.request_id)
        now = self.core.clock()
        deadline = now + self.hold_seconds
        hold = Hold(
            call.request_id, sequence.key, call.prompt_token_ids, now, deadline, call.extra_key
        )
        self.holds.park(hold)
        self.metrics.parked.inc()
        if self._writer is None:
            handle.put(output)
            return
        sequence = prompt_sequence(hold.prompt, self.block_size, hold.extra_key)
        blocks = self._gather(hold, sequence, 0, skip=self.disk.has)
        self._writer.submit(self._write_through, hold.request_id, blocks, handle, output)

    def export(self, request_id: str, held_hashes: tuple[int, ...]) -> list[KVBlock]:
        """Blocks after the receiver's held prefix; releases the hold (one pull per request)."""
        hold = self.holds.take(request_id)
        if hold is None:
            raise HoldNotFound(
                f"request {request_id!r} holds no KV here (not parked, pulled already, or "
                f"released after {self.hold_seconds:g} s)"
            )
        sequence = prompt_sequence(hold.prompt, self.block_size, hold.extra_key)
        hashes = sequence.hashes
        held = len(held_hashes)
        if tuple(hashes[:held]) != tuple(held_hashes):
            self.holds.park(hold)
            raise HeldPrefixMismatch(
                f"request {request_id!r}: the receiver's {held} held blocks are not a prefix of "
                f"this prompt's {len(hashes)} full blocks"
            )
        blocks = self._gather(hold, sequence, held)
        self.core.manager.finish_request(hold.key)
        self.metrics.blocks.labels("sent", "grpc").inc(len(blocks))
        self.metrics.bytes.labels("sent", "grpc").inc(sum(len(b.data) for b in blocks))
        return blocks

    def tick(self) -> None:
        """Release holds nobody pulled in time."""
        for hold in self.holds.expired(self.core.clock()):
            log.warning(
                "request %s: hand-off not pulled in %g s; released",
                hold.request_id,
                self.hold_seconds,
            )
            self._release(hold)
            self.metrics.expired.inc()

    def close(self) -> None:
        """Release every hold's pages (the core is stopping) and finish pending disk writes.

        Partial-block files stay on disk: a receiver may still complete the turn from them.
        """
        for hold in self.holds.all():
            self.core.manager.finish_request(hold.key)
        if self._writer is not None:
            self._writer.shutdown(wait=True)

    def _release(self, hold: Hold) -> None:
        self.core.manager.finish_request(hold.key)
        if self.disk is not None and len(hold.prompt) % self.block_size:
            for name in self.core.manager.life_cycles:
                self.disk.forget(hold.request_id, name, len(hold.prompt) // self.block_size)

    def _gather(self, hold: Hold, sequence: SequenceHashes, first: int, skip=None) -> list[KVBlock]:
        """Blocks `first..` of the held request, read from its pages; `skip(lc, hash)` leaves
        some out before any byte is read."""
        picked = select_blocks(
            self.core.manager, hold.key, sequence.hashes, len(hold.prompt), first
        )
        if skip is not None:
            picked = {
                name: [row for row in rows if not skip(name, row[1])]
                for name, rows in picked.items()
            }
        cache = self.core.compute.cache
        return read_selected(picked, sequence, lambda name, pages: read_pages(cache, name, pages))

    def _write_through(self, request_id: str, blocks: list[KVBlock], handle, output) -> None:
        """Writer thread: put the blocks on the shared disk, then let the router go on."""
        try:
            written = self.disk.write(request_id, blocks)
            self.metrics.blocks.labels("sent", "disk").inc(len(blocks))
            self.metrics.bytes.labels("sent", "disk").inc(written)
        except OSError as error:
            log.warning("request %s: disk write-through failed: %s", request_id, error)
        handle.put(output)
