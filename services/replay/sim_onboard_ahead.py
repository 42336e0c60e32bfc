"""A long host/disk prefix brought up in pieces before its request joins, as the engine does.

The engine's scheduler (`Scheduler._onboard_ahead`, docs/engine.md) admits a request whose
match has more than `onboard_pages_per_step` host/disk pages, while other sequences run, only
after bringing that many up a step: each piece is read and copied on the core thread before
the step, so every running sequence waits for it. The H100 fleet's step logs show these pauses
(2,472 pieces in three replays, 256 pages each mostly, median 39 ms; docs/sim-vs-live.md,
sixteenth and seventeenth looks).

The simulator's piece is the engine's: a prefix hold (`SimRank` keeps it as a hold of its own,
`ahead_key`) of the prompt up to the block after the piece's last lower block, admitted in the
kvstore, so its pages come up to the device then and stay held, and the room for them is made
as for an admission (retained turns released, then other holds cancelled). Each piece pauses
the rank before its step for what it onboarded (the admission's per-page figures; the copies
are the step's, as an admission's are); the next
piece's hold takes over the one before, and the request's admission finds the pieces' pages on
the device and onboards only the rest. This class keeps the plans; with no per-page figure the
request is admitted at once, as before the simulator modelled pieces.
"""

from __future__ import annotations

from collections.abc import Callable

from ...kvstore.results import PrefixMatch
from ..core.cost_figures import Hardware

# How long a piece's hold lasts if its request never joins (the engine's AHEAD_HOLD_SECONDS).
AHEAD_HOLD_SECONDS = 30.0


def ahead_key(request_id: str) -> str:
    """What the blocks brought up ahead of a request's admission are held under."""
    return f"admit-ahead:{request_id}"


class OnboardAhead:
    """Per waiting request: its match's lower block positions and how many were brought up."""

    def __init__(self, pages_per_step: int, hardware: Hardware | None) -> None:
        self.pages_per_step = pages_per_step
        # request id -> [its match's lower block positions, in order; positions done]
        self._plans: dict[str, list] = {}
        self.pieces = 0
        # NOTE: with no per-page figure a piece would cost nothing and only delay the request;
        # the simulator then admits at once, as it did before it modelled pieces.
        self.priced = hardware is not None and bool(
            hardware.admit_ms_per_host_page
            or hardware.admit_ms_per_disk_page
            or hardware.piece_ms_per_host_page
        )

    def next_piece_blocks(
        self, request_id: str, match_of: Callable[[], PrefixMatch], others_running: bool
    ) -> int | None:
        """The blocks of the prompt the request's next piece holds (its prefix up to the block
        after the piece's last lower one), or None when it joins now (nothing else runs, no
        figures, or what is left fits one piece); `match_of()` is its prefix match, read once,
        at its first piece (the engine's plan)."""
        step = self.pages_per_step
        if step <= 0 or not others_running or not self.priced:
            self._plans.pop(request_id, None)
            return None
        plan = self._plans.get(request_id)
        if plan is None:
            plan = self._plans[request_id] = [match_of().lower_positions(), 0]
        positions, done = plan
        if len(positions) - done <= step:
            del self._plans[request_id]
            return None  # the admission brings the rest up
        plan[1] = done + step
        return positions[done + step - 1] + 1

    def brought(self, request_id: str, pages: int) -> None:
        """A piece of the request brought `pages` up; with none, its plan ends (the admission
        goes as it would have)."""
        if pages:
            self.pieces += 1
        else:
            self._plans.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        """The request joined, left, or its piece found no room: its plan ends."""
        self._plans.pop(request_id, None)
