"""`kvfleet operator`: standalone by default, peering (leader election) when asked."""

from __future__ import annotations

import argparse

import kopf
from kvfleet.operator.cli import register
from kvfleet.operator.peering import PEERING_LIFETIME_SECONDS


def run_with(monkeypatch, *argv: str) -> dict:
    seen: dict = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: seen.update(kwargs))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["operator", *argv])
    assert args.func(args) == 0
    return seen


def test_one_replica_runs_standalone(monkeypatch):
    """Without peering objects a replica must not wait for peers that never come."""
    seen = run_with(monkeypatch)
    assert (seen["standalone"], seen["peering_name"]) == (True, None)


def test_replicas_with_peering_get_distinct_priorities(monkeypatch):
    """Equal priorities would let every replica run the handlers (no leader)."""
    first = run_with(monkeypatch, "--peering", "kv-kvfleet")
    second = run_with(monkeypatch, "--peering", "kv-kvfleet")
    assert (first["standalone"], first["peering_name"]) == (False, "kv-kvfleet")
    assert first["priority"] != second["priority"]
    assert run_with(monkeypatch, "--peering", "p", "--priority", "7")["priority"] == 7


def test_keepalives_expire_soon_enough_for_a_quick_failover(monkeypatch):
    """kopf's default lifetime (60 s) left the fleets without an operator for up to a minute."""
    settings = run_with(monkeypatch, "--peering", "kv-kvfleet")["settings"]
    assert settings.peering.lifetime == PEERING_LIFETIME_SECONDS <= 15


def test_only_replicas_with_peers_pass_the_start_up_gate(monkeypatch):
    """The gate announces a replica in its peering object; a standalone one has none."""
    peered = run_with(monkeypatch, "--peering", "kv", "--priority", "3", "--namespace", "a")
    assert peered["memo"].peering.priority == 3 and peered["memo"].peering.namespaces == ("a",)
    assert peered["memo"].peering.identity == peered["identity"]  # the same record as kopf's
    assert getattr(run_with(monkeypatch)["memo"], "peering", None) is None
