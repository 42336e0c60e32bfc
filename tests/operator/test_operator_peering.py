"""Which peers the start-up gate counts as alive, and where it writes its record."""

from __future__ import annotations

import datetime

from kvfleet.operator.peering import Peering, live_priorities

NOW = datetime.datetime(2026, 12, 6, 2, 0, 0, tzinfo=datetime.UTC)


def record(priority: int, seconds_ago: float, lifetime: int | None = 12) -> dict:
    seen = NOW - datetime.timedelta(seconds=seconds_ago)
    fields = {"priority": priority, "lastseen": seen.isoformat()}
    return fields if lifetime is None else {**fields, "lifetime": lifetime}


def test_a_record_counts_only_within_its_lifetime():
    """A dead leader's stale record must not hold the gate; a live one must."""
    body = {"status": {"alive": record(7, 11.9), "expired": record(8, 12.0)}}
    assert live_priorities(body, "me", NOW) == {"alive": 7}


def test_own_and_cleared_records_are_no_peers():
    """A replica is not its own rival; kopf clears a record by setting it to null."""
    body = {"status": {"me": record(7, 1), "gone": None, "other": record(3, 1)}}
    assert live_priorities(body, "me", NOW) == {"other": 3}


def test_a_record_without_lifetime_lives_kopfs_default_minute():
    """kopf assumes 60 s for a peer that states no lifetime; so must the gate."""
    body = {"status": {"old": record(1, 59, lifetime=None), "older": record(2, 61, lifetime=None)}}
    assert live_priorities(body, "me", NOW) == {"old": 1}
    assert live_priorities(None, "me", NOW) == {} == live_priorities({}, "me", NOW)


def test_the_gate_writes_where_kopf_peers():
    """Cluster-wide operators peer in the ClusterKopfPeering, namespaced ones in each namespace."""
    assert Peering("kv", "me", 1).paths() == ["/apis/kopf.dev/v1/clusterkopfpeerings/kv"]
    assert Peering("kv", "me", 1, ("a", "b")).paths() == [
        "/apis/kopf.dev/v1/namespaces/a/kopfpeerings/kv",
        "/apis/kopf.dev/v1/namespaces/b/kopfpeerings/kv",
    ]
