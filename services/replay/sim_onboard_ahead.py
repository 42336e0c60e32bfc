"""A long host/disk prefix brought up in pieces before its request joins, as the engine does.

The engine's scheduler (`Scheduler._onboard_ahead`, docs/engine.md) admits a request whose
match has more than `onboard_pages_per_step` host/disk pages, while other sequences run, only
after bringing that many up a step: each piece is read and copied on the core thread before
the step, so every running sequence waits for it. The H100 fleet's step logs show these pauses
(2,472 pieces in three replays, 256 pages each mostly, median 39 ms; docs/sim-vs-live.md,
sixteenth and seventeenth looks).

The simulator charges the pieces' time (the admission's per-page figures) and delays the
admission by as many steps; the pages themselves move at the admission, in the kvstore, all
at once (a piece is not a hold here, and a block that leaves the host tier for disk meanwhile
is read at the admission). What the pieces charged is not charged again at the admission
(`charged`). With no per-page figure the request is admitted at once.
"""

from __future__ import annotations

from collections.abc import Callable

from ...kvstore.results import LOWER_TIERS, PrefixMatch
from ...kvstore.tiers.metrics import DISK, HOST
from ..core.cost_figures import Hardware
from .sim_dispatch import admission_seconds


class OnboardAhead:
    """Per waiting request: its match's host/disk block positions and how many came up."""

    def __init__(self, pages_per_step: int, hardware: Hardware | None) -> None:
        self.pages_per_step = pages_per_step
        self.hardware = hardware
        # request id -> [(host pages, disk pages) per lower position, in order; pieces done]
        self._plans: dict[str, list] = {}
        # request id -> (host pages, disk pages) the pieces charged
        self.charged: dict[str, tuple[int, int]] = {}
        self.pieces = 0
        # NOTE: with no per-page figure a piece would cost nothing and only delay the request;
        # the simulator then admits at once, as it did before it modelled pieces.
        self.priced = hardware is not None and bool(
            hardware.admit_ms_per_host_page or hardware.admit_ms_per_disk_page
        )

    def piece_seconds(
        self, request_id: str, match_of: Callable[[], PrefixMatch], others_running: bool
    ) -> float | None:
        """The core thread's seconds for the request's next piece, or None when it joins now
        (no other sequence runs, no figures, or what is left fits one piece); `match_of()` is
        its prefix match, read once, at its first piece (the engine's plan)."""
        step = self.pages_per_step
        if step <= 0 or not others_running or not self.priced:
            self._plans.pop(request_id, None)
            return None
        plan = self._plans.get(request_id)
        if plan is None:
            plan = self._plans[request_id] = [_lower_positions(match_of()), 0]
        positions, done = plan
        if len(positions) - done <= step:
            # NOTE: the plan stays until the request joins: the pieces' pages do not move here,
            # so a fresh plan after an admission short of room would bring them up again.
            return None
        piece = positions[done : done + step]
        host = sum(h for h, _ in piece)
        disk = sum(d for _, d in piece)
        before_host, before_disk = self.charged.get(request_id, (0, 0))
        self.charged[request_id] = (before_host + host, before_disk + disk)
        plan[1] = done + step
        self.pieces += 1
        return admission_seconds(self.hardware, 0, host, disk)

    def joined(self, request_id: str) -> tuple[int, int]:
        """The request was admitted (or left): the (host, disk) pages its pieces charged."""
        self._plans.pop(request_id, None)
        return self.charged.pop(request_id, (0, 0))


def _lower_positions(match: PrefixMatch) -> list[tuple[int, int]]:
    """(host pages, disk pages) at each block position where any life cycle's block is on a
    lower tier, in position order (the engine's plan: the union of the positions)."""
    counts: dict[int, list[int]] = {}
    for where in match.locations.values():
        for index, tier in enumerate(where):
            if tier in LOWER_TIERS:
                pair = counts.setdefault(index, [0, 0])
                pair[0] += tier == HOST
                pair[1] += tier == DISK
    return [(counts[i][0], counts[i][1]) for i in sorted(counts)]
