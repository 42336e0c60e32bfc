"""The generation rank's half of a hand-off: reserve pages, fetch blocks, install, decode on.

`receive` runs on the gRPC thread that serves the request; the steps that touch the manager
run on the core thread (`call_on_core`), the fetch between them does not block the core:

| step     | thread | what                                                                  |
|----------|--------|-----------------------------------------------------------------------|
| reserve  | core   | track the request, match what this rank holds, admit pages for the rest |
| fetch    | gRPC   | transports in order (`grpc`, then `disk`) until the needed blocks came |
| install  | core   | write the bytes, commit per the reuse policy, run as a decoding sample |
| abort    | core   | every transport failed: release the reserved pages                     |
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from kvfleet.kvstore.block_pool import NULL_PAGE

from .blocks import NO_HASH, CorruptBlockError, KVBlock, install_blocks, kv_layout
from .context_side import prompt_hashes
from .transports import FetchRequest, HandoffTransport, TransportError

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


class GenerationSide:
    """Receives hand-offs on one rank."""

    def __init__(self, core, transports: Seq[HandoffTransport], timeout_seconds: float) -> None:
        self.core = core
        self.transports = list(transports)
        self.timeout_seconds = timeout_seconds
        self.metrics = core.metrics.handoff

    def receive(self, call, source_address: str, handoff_tokens: tuple[int, ...]):
        """Get the request's KV and start decoding after `handoff_tokens`; its RequestHandle."""
        if not handoff_tokens:
            raise ValueError("handoff_token_ids: empty; the context rank's tokens are needed")
        core = self.core
        reservation = core.call_on_core(lambda: self._reserve(call, handoff_tokens))
        request = FetchRequest(
            call.request_id,
            source_address,
            reservation.held_hashes,
            reservation.wanted,
            self.timeout_seconds,
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
        manager.add_request(sequence.key, call.prompt_token_ids, call.conversation_id)
        match = manager.match(sequence.key)
        count = len(call.prompt_token_ids) - match.num_reusable_tokens
        if not self._room(sequence.key, count):
            manager.finish_request(sequence.key)
            raise HandoffNoRoom(
                f"request {call.request_id}: no slot or no pages for {count} tokens "
                f"({len(core.scheduler.running)} of {core.config.max_batch_size} slots running)"
            )
        # NOTE: admission onboards host/disk blocks and may reuse less than the match said (a
        # disk file that failed its checks): what it did not reuse must arrive by hand-off too.
        reused = manager.admit(sequence.key, count).num_reused_tokens
        shortfall = match.num_reusable_tokens - reused
        if shortfall and not manager.can_allocate(sequence.key, shortfall):
            manager.finish_request(sequence.key)
            raise HandoffNoRoom(
                f"request {call.request_id}: no pages for the {shortfall} tokens a bad tier "
                "file left to fetch"
            )
        if shortfall:
            manager.allocate(sequence.key, shortfall)
        k = reused // manager.config.block_size
        hashes = prompt_hashes(call.prompt_token_ids, manager.config.block_size)
        tables = {name: manager.page_table(sequence.key, name) for name in manager.life_cycles}
        # Held: on this rank's device, or onboarded from its host/disk tier by `admit`.
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
        return Reservation(
            sequence,
            k,
            tuple(hashes[:k]),
            skipped,
            wanted,
            self._required(sequence, k),
            tables,
            handoff_tokens,
            skipped_bytes,
        )

    def _room(self, key: str, count: int) -> bool:
        core, manager = self.core, self.core.manager
        if len(core.scheduler.running) >= core.config.max_batch_size:
            return False
        fits = lambda: manager.can_admit(key, count)  # noqa: E731
        return fits() or core.scheduler.release_retained_until(fits)

    def _required(self, sequence, first: int) -> dict[str, frozenset[int]]:
        """Blocks that must arrive: those decoding reads and those the reuse policy commits."""
        manager = self.core.manager
        bs = manager.config.block_size
        prompt_len = len(sequence.call.prompt_token_ids)
        num_blocks, full_blocks = -(-prompt_len // bs), prompt_len // bs
        checkpoint = manager.progress(sequence.key).checkpoint_tokens
        every = manager.config.reuse_policy.commits_every_block
        required = {}
        for name, life_cycle in manager.life_cycles.items():
            if not life_cycle.required:
                continue
            needed = set(range(life_cycle.first_live_block(prompt_len, bs), num_blocks))
            if life_cycle.needs_whole_prefix or (every and life_cycle.reusable):
                needed.update(range(full_blocks))
            elif life_cycle.reusable:
                needed.update(life_cycle.resume_blocks(full_blocks, bs))
                if checkpoint is not None:
                    needed.update(life_cycle.resume_blocks(checkpoint // bs, bs))
            required[name] = frozenset(i for i in needed if i >= first)
        return required

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
