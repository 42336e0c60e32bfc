"""The ids a rank knows a turn's placements by."""

from __future__ import annotations


def attempt_id(request_id: str, earlier_attempts: int) -> str:
    """The id a placement's engine knows the turn by: the router's for the first, a suffixed
    one after (`id~2`, `id~3`, ...), so a retry never meets the attempt it replaces."""
    return request_id if not earlier_attempts else f"{request_id}~{earlier_attempts + 1}"
