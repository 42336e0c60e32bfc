"""How long a forwarded engine call may run, from the client's deadline and the router's cap."""

from __future__ import annotations

# gRPC reports "no deadline" as a remaining time of about 9.2e18 s (the largest int64 of
# nanoseconds); forwarding that as a timeout overflows into an immediate DEADLINE_EXCEEDED.
# Anything beyond a year is taken for no deadline at all.
NO_DEADLINE_SECONDS = 365 * 24 * 3600.0


def call_timeout(context, cap_seconds: float | None) -> float | None:
    """The timeout for a call made on behalf of `context`: its deadline, bounded by the cap.

    None means no deadline (the client set none and the router has no cap)."""
    remaining = context.time_remaining()
    if remaining is None or remaining > NO_DEADLINE_SECONDS:
        return cap_seconds
    return remaining if cap_seconds is None else min(remaining, cap_seconds)
