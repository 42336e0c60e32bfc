"""Response headers that say which rank served a request and why: a router's placement
(`x-kvfleet-rank`, `x-kvfleet-placement`: "pinned", "new", "away", "fallback", "rehomed",
"explicit"), so a client or a replay can see where each turn of a conversation ran. A rank's
own API, where no router placed the request, sends none."""

from __future__ import annotations

from ..request.engine_request import SampleOutput

RANK_HEADER = "x-kvfleet-rank"
PLACEMENT_HEADER = "x-kvfleet-placement"


def served_headers(first: SampleOutput | None) -> dict[str, str]:
    """The headers for a request whose first output is `first`."""
    served = first.served_by if first is not None else None
    if served is None:
        return {}
    return {RANK_HEADER: served.rank_id, PLACEMENT_HEADER: served.placement}
