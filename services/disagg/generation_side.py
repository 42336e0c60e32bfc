"""The generation rank's half of a hand-off: reserve pages, fetch blocks, install, decode on.

`receive` runs on the gRPC thread that serves the request; the steps that touch the manager
run on the core thread (`call_on_core`), the fetch between them does not block the core:

| step     | thread | what                                                                  |
|----------|--------|-----------------------------------------------------------------------|
| reserve  | core   | track the request, match what this rank holds, `admit_computed` pages  |
|          |        | for the blocks after it that decoding reads or the reuse policy commits |
| fetch    | gRPC   | transports in order (`grpc`, then `disk`) until the needed blocks came |
| install  | core   | write the bytes, commit per the reuse policy, run as a decoding sample |
| abort    | core   | every transport failed: release the reserved pages                     |
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from ...kvstore.admission import MatchShrankError
from ...kvstore.block_pool import NULL_PAGE
from .blocks import NO_HASH, CorruptBlockError, KVBlock, install_blocks, kv_layout
from .context_side import prompt_sequence
from .transport_types import FetchRequest, HandoffTransport, TransportError

log = logging.getLogger(__name__)


class HandoffFailed(RuntimeError):
    """No transport delivered the request's KV; the message names each transport's failure."""


class HandoffNoRoom(RuntimeError):
    """This rank has no slot or pages for the request's KV now."""


class MissingBlocks(TransportError):
    """A transport delivered some blocks but not every one the receiver needs."""


@dataclass
class Reservation:
    """A request this rank tracks and has pages for, waiting for its bytes."""

    sequence: object
    first_block: int
    held_hashes: tuple[int, ...]
    skipped: int
    wanted: dict[str, tuple[tuple[int, int], ...]]
    required: dict[str, frozenset[int]]
    page_tables: dict[str, tuple[int, ...]]
    tokens: tuple[int, ...]
    skipped_bytes: int
    contents: dict[int, bytes]  # full wanted blocks: what their shared disk files must hold


class GenerationSide:
    """Receives hand-offs on one rank."""

    def __init__(self, core, transports: Seq[HandoffTransport], timeout_seconds: float) -> None:
        self.core = core
        self.transports = list(transports)
        self.timeout_seconds = timeout_seconds
        self.metrics = core.metrics.handoff

    def receive(
        self,
        call,
        source_address: str,
        handoff_tokens: tuple[int, ...],
        source_request_id: str = "",
    ):
        """Get the request's KV and start decoding after `handoff_tokens`; its RequestHandle.
        The source parked the KV as `source_request_id` (empty: the call's own id)."""
        if not handoff_tokens:
            raise ValueError("handoff_token_ids: empty; the context rank's tokens are needed")
        core = self.core
        reservation = core.call_on_core(lambda: self._reserve(call, handoff_tokens))
        request = FetchRequest(
            source_request_id or call.request_id,
            source_address,
            reservation.held_hashes,
            reservation.wanted,
            self.timeout_seconds,
            reservation.contents,
        )
        try:
            return self._fetch_and_install(request, reservation)
        except BaseException:
            core.call_on_core(lambda: core.manager.finish_request(reservation.sequence.key))
            raise

    def _fetch_and_install(self, request: FetchRequest, reservation: Reservation):
        """Try each transport until one delivers; HandoffFailed names every failure."""
        core = self.core
        failures = []
        for transport in self.transports:
            started = time.perf_counter()
            try:
                blocks = transport.fetch(request)
                handle = core.call_on_core(
                    lambda b=blocks, t=transport.name: self._install(reservation, b, t)
                )
            except (TransportError, CorruptBlockError) as error:
                failures.append(f"{transport.name}: {error}")
                self.metrics.failures.labels(transport.name).inc()
                continue
            self.metrics.seconds.labels(transport.name).observe(time.perf_counter() - started)
            for other in self.transports:
                other.done(request)
            return handle
        raise HandoffFailed(
            f"request {request.request_id}: KV hand-off from "
            f"{request.source_address or 'nowhere'} failed: "
            + ("; ".join(failures) or "no transport configured")
        )

    # -- core thread ---------------------------------------------------------------------------

    def _reserve(self, call, handoff_tokens: tuple[int, ...]) -> Reservation:
        core, manager = self.core, self.core.manager
        core.validate(call)
        if len(handoff_tokens) >= call.sampling.max_tokens:
            raise ValueError(
                f"handoff_token_ids: {len(handoff_tokens)} tokens leave nothing of max_tokens "
                f"{call.sampling.max_tokens} to generate"
            )
        sequence = core.new_sequence(call)
        manager.add_request(
            sequence.key,
            call.prompt_token_ids,
            call.conversation_id,
            call.extra_key,
            call.branch_hints,
        )
        if not self._room(sequence.key):
            manager.finish_request(sequence.key)
            raise HandoffNoRoom(
                f"request {call.request_id}: no slot or no pages for its "
                f"{len(call.prompt_token_ids)}-token prompt "
                f"({len(core.scheduler.running)} of {core.config.max_batch_size} slots running)"
            )
        # NOTE: pages only for the blocks decoding reads or the reuse policy commits, so a
        # window pool holds a window, not the prompt. Admission onboards host/disk blocks and
        # may reuse less than a match said (a disk file that failed its checks): it plans the
        # pages from what it did reuse, and those blocks arrive by hand-off too.
        try:
            reused = manager.admit_computed(sequence.key).num_reused_tokens
        except MatchShrankError as error:  # an unreadable disk block: the rest did not fit
            manager.finish_request(sequence.key)
            raise HandoffNoRoom(f"request {call.request_id}: {error}") from error
        k = reused // manager.config.block_size
        prompt = prompt_sequence(call.prompt_token_ids, manager.config.block_size, call.extra_key)
        hashes = prompt.hashes
        tables = {name: manager.page_table(sequence.key, name) for name in manager.life_cycles}
        # Held: on this rank's device, or onboarded from its host/disk tier by admission.
        held = {name: sum(p != NULL_PAGE for p in table[:k]) for name, table in tables.items()}
        skipped = sum(held.values())
        layout = kv_layout(core.compute.cache)
        skipped_bytes = sum(count * layout.page_bytes(name) for name, count in held.items())
        wanted = {
            name: tuple(
                (index, hashes[index] if index < len(hashes) else NO_HASH)
                for index in range(k, len(table))
                if table[index] != NULL_PAGE
            )
            for name, table in tables.items()
        }
        # Every block with a page after the held prefix must arrive (an optional life cycle
        # short of pages has fewer; whatever of it arrives is used).
        required = {
            name: frozenset(index for index, _ in rows)
            for name, rows in wanted.items()
            if manager.life_cycles[name].required
        }
        return Reservation(
            sequence,
            k,
            tuple(hashes[:k]),
            skipped,
            wanted,
            required,
            tables,
            handoff_tokens,
            skipped_bytes,
            {
                index: prompt.contents(index)
                for rows in wanted.values()
                for index, block_hash in rows
                if block_hash != NO_HASH
            },
        )

    def _room(self, key: str) -> bool:
        core, manager = self.core, self.core.manager
        if len(core.scheduler.running) >= core.config.max_batch_size:
            return False
        fits = lambda: manager.can_admit_computed(key)  # noqa: E731
        return fits() or core.scheduler.release_retained_until(fits)

    def _install(self, reservation: Reservation, blocks: list[KVBlock], transport: str):
        core, manager = self.core, self.core.manager
        sequence = reservation.sequence
        received: dict[str, set[int]] = {}
        for block in blocks:
            received.setdefault(block.life_cycle, set()).add(block.index)
        missing = {
            name: sorted(needed - received.get(name, set()))
            for name, needed in reservation.required.items()
            if needed - received.get(name, set())
        }
        if missing:
            raise MissingBlocks(f"blocks missing after the held prefix: {missing}")
        # NOTE: the sender has every block it still holds; one this rank gave no page (slid
        # out of the window, committed by no policy here) is neither read nor committed.
        blocks = [block for block in blocks if _has_page(reservation, block)]
        size = install_blocks(core.compute.cache, reservation.page_tables, blocks)
        prompt_len = len(sequence.call.prompt_token_ids)
        manager.commit(sequence.key, prompt_len)
        self.metrics.blocks.labels("received", transport).inc(len(blocks))
        self.metrics.bytes.labels("received", transport).inc(size)
        self.metrics.blocks_skipped.inc(reservation.skipped)
        self.metrics.bytes_skipped.inc(reservation.skipped_bytes)
        return core.adopt(sequence, match_tokens(reservation, manager), reservation.tokens)


def match_tokens(reservation: Reservation, manager) -> int:
    """Prompt tokens the receiver reused (its held prefix)."""
    return reservation.first_block * manager.config.block_size


def _has_page(reservation: Reservation, block: KVBlock) -> bool:
    """False for a block at a position the receiver left NULL (out-of-range ones stay, so
    `install_blocks` reports them)."""
    table = reservation.page_tables.get(block.life_cycle, ())
    return not (0 <= block.index < len(table) and table[block.index] == NULL_PAGE)
