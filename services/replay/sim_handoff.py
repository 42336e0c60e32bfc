"""The simulated KV hand-off between a context rank and a generation rank.

The same rule as the live ranks (`docs/disaggregation.md`, "Which blocks move"):

| step     | rank       | what                                                                  |
|----------|------------|-----------------------------------------------------------------------|
| park     | context    | after the first token: leave the batch, keep the pages (a hold)       |
| receive  | generation | track the request (`add_request`); reservation waits for a step start |
| reserve  | generation | match what it holds (k blocks, host/disk onboarded), admit the rest   |
| export   | context    | `select_blocks(first=k)`: blocks k.. of every life cycle it has       |
| transfer | link       | moved bytes / `handoff_link_gb_s` (+ onboarding), off both step loops |
| release  | context    | `finish_request`: the hold's pages go back (retained turns stay)      |
| adopt    | generation | commit the prompt, finish its context, decode from the 2nd token     |

`HandoffSide` is the hand-off half of `SimRank`, split out for size: the rank is still the only
caller of its manager. The fleet orders the steps and owns the link.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ...kvstore.block_pool import NULL_PAGE
from ..router.model import Role
from .sim_request import SimRequest

# What a rank does after a request's first token, per role (as services/disagg/roles.py).
PARKS_AFTER_FIRST_TOKEN: dict[Role, bool] = {
    Role.BOTH: False,
    Role.CONTEXT: True,
    Role.GENERATION: False,
}

ReservedCallback = Callable[[SimRequest, "Reservation"], None]


@dataclass(frozen=True)
class Reservation:
    """What a generation rank holds of a received prompt once its pages are admitted."""

    held_blocks: int  # k: the prompt's first k blocks are on this rank (device or its tiers)
    held_pages: dict[str, int]  # pages of those blocks, per life cycle (not moved)
    host_pages_in: int
    disk_pages_in: int


@dataclass(frozen=True)
class HandoffStats:
    """One hand-off as measured: what moved, what skipping the held blocks saved, when."""

    context_rank: str
    generation_rank: str
    held_blocks: int
    moved_bytes: int  # blocks k.. the context rank has
    unskipped_bytes: int  # blocks 0.. the context rank has: no skipping of held blocks
    parked_s: float
    reserved_s: float
    done_s: float


def pages_from(manager, request: SimRequest, first_block: int) -> dict[str, int]:
    """Pages per life cycle that the context rank sends for blocks `first_block..` of the
    prompt: the live rule, `context_side.select_blocks` over this manager."""
    # NOTE: imported here: the disagg package loads torch, which only disaggregated fleets need.
    from ..disagg.context_side import prompt_hashes, select_blocks

    hashes = prompt_hashes(tuple(request.tokens), manager.config.block_size)
    rows = select_blocks(manager, request.request_id, hashes, request.prompt_len, first_block)
    return {name: len(picked) for name, picked in rows.items()}


def page_bytes_of(pages: dict[str, int], page_bytes: dict[str, int]) -> int:
    """Bytes of `pages` per life cycle."""
    return sum(count * page_bytes[name] for name, count in pages.items())


class HandoffSide:
    """Park / export / release on a context rank; receive / reserve / adopt on a generation
    rank. Mixed into `SimRank`, whose state (`manager`, `running`, ...) it uses."""

    def _init_handoff(self, on_parked, on_reserved: ReservedCallback | None) -> None:
        self.parks = PARKS_AFTER_FIRST_TOKEN[self.role]
        self.on_parked = on_parked
        self.on_reserved = on_reserved
        self.parked: dict[str, SimRequest] = {}
        self.receiving: deque[SimRequest] = deque()
        self.in_transfer: dict[str, SimRequest] = {}
        # NOTE: a reservation is retried only after pages may have come back (a commit, a
        # finish, a release), not at every decode step: a match of a long prompt is costly.
        self.retry_reserve = False

    @property
    def pages_coming_back(self) -> bool:
        """True when pages held outside the batch (holds, transfers) will free or run later."""
        return bool(self.parked or self.in_transfer)

    # -- context side ------------------------------------------------------------------------------

    def _park(self, request: SimRequest) -> None:
        """Leave the batch after the first token; the pages stay until `release_hold`."""
        self.running.remove(request)
        self.parked[request.request_id] = request
        request.context_rank_id = self.rank_id
        self.on_parked(request)

    def export_pages(self, request: SimRequest, first_block: int) -> dict[str, int]:
        """Pages per life cycle this rank would send for blocks `first_block..` (no change)."""
        return pages_from(self.manager, request, first_block)

    def release_hold(self, request: SimRequest) -> None:
        """The KV was pulled (or is no longer wanted): release the parked request's pages."""
        del self.parked[request.request_id]
        self.manager.finish_request(request.request_id)
        self.retry_reserve = True
        self._wake()

    # -- generation side ---------------------------------------------------------------------------

    def receive(self, request: SimRequest) -> None:
        """A hand-off placed here by the router; pages are reserved at the next step start."""
        request.rank_id = self.rank_id
        self.manager.add_request(
            request.request_id,
            request.tokens,
            request.conversation_id,
            branch_hints=request.branch_hints,
        )
        self.receiving.append(request)
        self.retry_reserve = True
        self._wake()

    def _reserve_received(self) -> None:
        """Reserve pages for received hand-offs, first come first served."""
        if not self.retry_reserve:
            return
        self.retry_reserve = False
        while self.receiving:
            request = self.receiving[0]
            reservation = self._reserve(request)
            if reservation is None:
                if self.running or self.waiting or self.pages_coming_back:
                    return  # pages come back when those finish
                self._fail(request)
                continue
            self.receiving.popleft()
            self.in_transfer[request.request_id] = request
            self.on_reserved(request, reservation)

    def _reserve(self, request: SimRequest) -> Reservation | None:
        """Admit pages for the prompt minus what this rank holds, or None when short.

        NOTE: pages are taken a step's token budget at a time, committing as they go, so the
        pages of window blocks that slide out come back and a window pool needs a window plus
        a chunk, not the whole prompt. The live receiver gets the same bound another way:
        `admit_computed` gives window blocks pages only where decoding reads or the policy
        commits.
        """
        manager, rid = self.manager, request.request_id
        admitted = self._admit_pages(request, self.token_budget)
        if admitted is None:
            return None
        reused = admitted.allocation.num_reused_tokens
        request.computed = request.committed = reused
        request.pages_tokens = admitted.allocation.num_tokens_with_pages
        held_blocks = reused // manager.config.block_size
        held = {
            name: sum(page != NULL_PAGE for page in manager.page_table(rid, name)[:held_blocks])
            for name in manager.life_cycles
        }
        if not self._take_rest(request):
            manager.finish_request(rid)
            manager.add_request(
                rid, request.tokens, request.conversation_id, branch_hints=request.branch_hints
            )
            return None
        request.host_pages_in += admitted.host_pages_in
        request.disk_pages_in += admitted.disk_pages_in
        return Reservation(held_blocks, held, admitted.host_pages_in, admitted.disk_pages_in)

    def _take_rest(self, request: SimRequest) -> bool:
        """Pages for the prompt after the first chunk, a chunk at a time; False when short."""
        while request.pages_tokens < request.prompt_len:
            request.computed = request.pages_tokens
            count = min(request.prompt_len - request.computed, self.token_budget)
            if not self.retained.fits_or_release(lambda c=count: self._fits(request, c)):
                return False
            self._allocate(request, count)
        return True

    def adopt(self, request: SimRequest) -> None:
        """The KV arrived: commit the prompt, retain the turn, decode from the next token."""
        del self.in_transfer[request.request_id]
        request.computed = request.prompt_len
        self._commit(request)
        self.context_ended(request)
        self.running.append(request)
        self._wake()
