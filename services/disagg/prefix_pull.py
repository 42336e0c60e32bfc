"""The new rank's half of a moved turn: pull its prefix from the home, hold it for the turn.

When the router places a conversation's turn away from its home it names the home
(`EngineGenerateRequest.kv_home_address`); before the turn is submitted here:

| step    | thread | what                                                                       |
|---------|--------|----------------------------------------------------------------------------|
| held    | core   | match the prompt here: k blocks on the device, host or shared disk tier    |
| fetch   | gRPC   | the `grpc` hand-off transport: `PullKvBlocks(prompt, k held ids)` from the  |
|         |        | home, which sends its blocks after them (`prefix_export.py`)               |
| install | core   | the longest resume point the blocks complete (`complete_blocks`); admit a  |
|         |        | request over the prompt up to there as computed elsewhere, write the blocks |
|         |        | into its pages, commit, and hold it until the turn is admitted             |

The turn is then submitted as any other: its match finds the held prefix, and only the tokens
neither rank had are computed. Blocks on the shared disk are never pulled: the match already
counts them (a drained home's flush, or blocks its host tier evicted), and admission reads
them. A pull that fails (home gone, blocks missing, no room) leaves nothing behind and costs
only the recompute; a block with a page that did not arrive is never committed.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ...kvstore.admission import computed_blocks
from ...kvstore.block_pool import NULL_PAGE
from ...kvstore.config import KVStoreConfig
from ...kvstore.life_cycles import LifeCycle
from .blocks import CorruptBlockError, KVBlock
from .context_side import prompt_sequence
from .metrics import FAILED, MISSING, NO_ROOM, NOTHING, PULLED
from .page_io import pages_of
from .transport_types import FetchRequest, HandoffTransport, TransportError

log = logging.getLogger(__name__)

MAX_ADDRESS_CHARS = 255
_IDS = itertools.count()


def check_home_address(address: str) -> None:
    """Raise ValueError naming `kv_home_address` unless it is a host:port to dial."""
    host, sep, port = address.rpartition(":")
    if len(address) > MAX_ADDRESS_CHARS:
        raise ValueError(f"kv_home_address: {len(address)} chars > {MAX_ADDRESS_CHARS}")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"kv_home_address: {address[:64]!r} is not host:port")


def complete_blocks(
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
    received: Mapping[str, set[int]],
    held: int,
) -> int:
    """The most blocks p > `held` of the prompt whose resume point the received blocks
    complete: every block of a reusable life cycle after the held prefix that a prompt of p
    blocks computed elsewhere keeps (`computed_blocks`) arrived; `held` when there is none."""
    reusable = {name: lc for name, lc in life_cycles.items() if lc.reusable}
    most = max((index + 1 for got in received.values() for index in got), default=held)
    for name, lc in reusable.items():
        if lc.needs_whole_prefix:  # every block up to p: p stops at the first gap
            got, gap = received.get(name, set()), held
            while gap in got:
                gap += 1
            most = min(most, gap)
    windows = {name: lc for name, lc in reusable.items() if not lc.needs_whole_prefix}
    size = config.block_size
    for blocks in range(most, held, -1):
        needed = computed_blocks(windows, config, blocks * size, held * size)
        if all(set(needed[name]) <= received.get(name, set()) for name in windows):
            return blocks
    return held


@dataclass(frozen=True)
class PullOutcome:
    """What one moved turn's pull did."""

    outcome: str  # metrics.PULLED, NOTHING, FAILED, MISSING or NO_ROOM
    blocks: int = 0
    tokens: int = 0  # prompt tokens the held blocks add to what this rank had


class PrefixPull:
    """Pulls moved turns' prefixes on one rank; the gRPC threads call `pull`."""

    def __init__(
        self, core, transport: HandoffTransport, timeout_seconds: float, hold_seconds: float
    ) -> None:
        self.core = core
        self.transport = transport
        self.timeout_seconds = timeout_seconds
        self.hold_seconds = hold_seconds
        self.metrics = core.metrics.handoff.moves

    def pull(self, call, home_address: str) -> PullOutcome:
        """Hold the blocks of `call`'s prompt that the home has past this rank's; never
        raises for what only costs a recompute."""
        check_home_address(home_address)
        if not call.conversation_id:
            return PullOutcome(NOTHING)  # holds are the conversation's; no conversation, no pull
        started = time.perf_counter()
        try:
            outcome = self._pull(call, home_address)
        except (TimeoutError, RuntimeError) as error:  # a busy or stopping core: recompute
            log.warning("request %s: prefix pull given up: %s", call.request_id, error)
            outcome = PullOutcome(FAILED)
        self.metrics.turns.labels(outcome.outcome).inc()
        if outcome.outcome == PULLED:
            self.metrics.tokens.inc(outcome.tokens)
            self.metrics.seconds.observe(time.perf_counter() - started)
        return outcome

    def _pull(self, call, home_address: str) -> PullOutcome:
        core = self.core
        size = core.manager.config.block_size
        hashes = prompt_sequence(call.prompt_token_ids, size, call.extra_key).hashes
        held = core.call_on_core(lambda: self._held_blocks(call))
        request = FetchRequest(
            call.request_id,
            home_address,
            tuple(hashes[:held]),
            {},
            self.timeout_seconds,
            prompt=call.prompt_token_ids,
            cache_salt=call.cache_salt,
        )
        try:
            blocks = self.transport.fetch(request)
        except TransportError as error:
            log.warning("request %s: no prefix from home %s: %s", call.request_id,
                        home_address, error)  # fmt: skip
            return PullOutcome(FAILED)
        if not blocks:
            return PullOutcome(NOTHING)
        # A block is taken only under the id this prompt gives its position: never another's.
        blocks = [b for b in blocks if b.index < len(hashes) and b.block_hash == hashes[b.index]]
        self.metrics.blocks.labels("received").inc(len(blocks))
        self.metrics.bytes.labels("received").inc(sum(len(block.data) for block in blocks))
        return core.call_on_core(lambda: self._install(call, held, blocks))

    # -- core thread ---------------------------------------------------------------------------

    def _held_blocks(self, call) -> int:
        """Blocks of the prompt this rank can resume from now (any of its tiers)."""
        manager = self.core.manager
        key = f"moved-probe-{next(_IDS)}"
        manager.add_request(key, call.prompt_token_ids, None, call.extra_key)
        try:
            return manager.match(key).num_reusable_tokens // manager.config.block_size
        finally:
            manager.finish_request(key)

    def _install(self, call, held: int, blocks: list[KVBlock]) -> PullOutcome:
        core, manager = self.core, self.core.manager
        size = manager.config.block_size
        by_position = {(block.life_cycle, block.index): block for block in blocks}
        received: dict[str, set[int]] = {}
        for name, index in by_position:
            received.setdefault(name, set()).add(index)
        reach = complete_blocks(manager.life_cycles, manager.config, received, held)
        if reach <= held:
            return PullOutcome(MISSING)
        key = f"moved-{call.request_id}-{next(_IDS)}"
        manager.add_request(key, call.prompt_token_ids[: reach * size], None, call.extra_key)
        fits = lambda: manager.can_admit_computed(key)  # noqa: E731
        if not (fits() or core.scheduler.release_retained_until(fits)):
            manager.finish_request(key)
            return PullOutcome(NO_ROOM)
        reused = manager.admit_computed(key).num_reused_tokens // size
        tables = {name: manager.page_table(key, name) for name in manager.life_cycles}
        # NOTE: every page of a reusable life cycle after the reused prefix gets committed, so
        # each must receive its block: one that did not arrive would publish stale bytes.
        wanted = [
            (name, index)
            for name, table in tables.items()
            if manager.life_cycles[name].reusable
            for index in range(reused, len(table))
            if table[index] != NULL_PAGE
        ]
        if any(position not in by_position for position in wanted):
            manager.finish_request(key)
            return PullOutcome(MISSING)
        installed = [by_position[position] for position in wanted]
        try:
            pages_of(core).install(tables, installed)
        except CorruptBlockError as error:
            log.warning("request %s: pulled prefix refused: %s", call.request_id, error)
            manager.finish_request(key)
            return PullOutcome(FAILED)
        manager.commit(key, reach * size)
        core.scheduler.holds.keep(call.conversation_id, key, self.hold_seconds)
        return PullOutcome(PULLED, len(installed), (reach - reused) * size)
