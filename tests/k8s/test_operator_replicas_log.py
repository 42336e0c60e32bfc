"""The failover tests' reading of an operator replica's log (no cluster needed)."""

from __future__ import annotations

from operator_replicas import forbidden_lines


def test_a_refusal_is_found_and_a_pid_with_403_in_it_is_not():
    """If this fails, a failover test fails whenever a replica's pid holds the digits 403 (as
    it did once: "vm/13403/..."), or misses the API server refusing the operator something."""
    refusals = [
        "Request attempt #1 failed; will retry: PATCH /apis -> APIForbiddenError('forbidden')",
        "HTTP response (403) to a PATCH",
        "GET https://x/api/v1/pods -> 403, message='Forbidden'",
        "status 403 for kvfleets.kvfleet.dev",
    ]
    harmless = [
        "Announced to peers as 'vm/13403/bb5b4d'; reading them in 5.0 s.",
        "Announced to peers as 'vm/403/bb5b4d'; reading them in 5.0 s.",
        "Handler 'reconcile' succeeded after 4030 ms.",
        "Keep-alive in 'kv-kvfleet' in the cluster: 4403.",
    ]
    assert forbidden_lines(refusals + harmless) == refusals
