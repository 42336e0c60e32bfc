"""Leader election among operator replicas (kopf peering): how soon a standby takes over from a
leader that died without a word (kill -9, a lost node), and a start-up gate so that a new
replica never runs handlers beside a live leader."""

from __future__ import annotations

import datetime
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass

import kopf

from .kube import KubeApi

# How long a replica's keep-alive record counts as alive. kopf re-writes each replica's record
# every `lifetime - randint(5, 10)` s (at least 1 s), and a standby takes over once the leader's
# newest record is `lifetime` old. So a leader killed u s after its last keep-alive is replaced
# `lifetime - u` s later, between lifetime - 10 and lifetime: with 12, within 12 s plus a watch
# round-trip (the target is 15 s), where kopf's default 60 took up to a minute. A live leader's
# record still has kopf's 5-10 s of slack for a slow PATCH before it would expire, whatever the
# lifetime; the price of a short one is a keep-alive PATCH every 2-7 s per replica.
PEERING_LIFETIME_SECONDS = 12
# How long a new replica waits, its record written, before it reads its peers and may act.
# kopf alone acts on its first read of the peering object: a replica of higher priority joining
# a live leader ran handlers before the leader had even seen it (a ~40 ms overlap), and of two
# replicas started together the lower one ran until the other's first keep-alive came. The
# leader sees the newcomer's record within milliseconds through its watch and pauses; the wait
# covers a slow watch on a loaded node and a handler the leader had already begun (kopf lets a
# running handler finish; ours take well under a second on a healthy server), and any replica
# started up to this long after this one is seen before this one acts.
SETTLE_SECONDS = 5.0
# kopf assumes this lifetime for a record that states none.
_KOPF_DEFAULT_LIFETIME = 60


@dataclass(frozen=True)
class Peering:
    """This replica in its peering objects: the cluster-wide one, or one per watched namespace."""

    name: str
    identity: str
    priority: int
    namespaces: tuple[str, ...] = ()

    def paths(self) -> list[str]:
        if not self.namespaces:
            return [f"/apis/kopf.dev/v1/clusterkopfpeerings/{self.name}"]
        return [
            f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{self.name}"
            for namespace in self.namespaces
        ]


class PriorityTaken(kopf.PermanentError):
    """A live peer has this replica's priority: kopf would pause both, and no one would lead."""


def peering_settings() -> kopf.OperatorSettings:
    """kopf settings for a replica that elects a leader with its peers."""
    settings = kopf.OperatorSettings()
    settings.peering.lifetime = PEERING_LIFETIME_SECONDS
    return settings


def own_identity() -> str:
    """A replica's name in the peering records: its pod's name (the hostname in a pod), made
    unique by the process id and a random suffix."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


def live_priorities(body: dict | None, identity: str, now: datetime.datetime) -> dict[str, int]:
    """identity -> priority of every other peer whose keep-alive record has not expired."""
    live = {}
    for peer, record in ((body or {}).get("status") or {}).items():
        if peer == identity or not isinstance(record, dict) or "lastseen" not in record:
            continue
        seen = datetime.datetime.fromisoformat(record["lastseen"])
        lifetime = datetime.timedelta(seconds=int(record.get("lifetime", _KOPF_DEFAULT_LIFETIME)))
        if seen + lifetime > now:
            live[peer] = int(record.get("priority", 0))
    return live


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def announce_and_settle(api: KubeApi, peering: Peering, logger: logging.Logger) -> None:
    """Write this replica's keep-alive record, then wait SETTLE_SECONDS, so that a live leader
    has paused before this replica may act, and a peer started alongside has been seen; raise
    PriorityTaken when a live peer has this replica's priority (checked before the record is
    written, so a running leader is never paused by it, and again after the wait)."""
    _refuse_equal_priority(api, peering, _now())
    record = {"priority": peering.priority, "lifetime": PEERING_LIFETIME_SECONDS}
    for path in peering.paths():
        patch = {"status": {peering.identity: {**record, "lastseen": _now().isoformat()}}}
        if api.merge_patch(path, patch) is None:
            logger.warning(f"No peering object at {path}: kopf will wait for one.")
    logger.info(f"Announced to peers as {peering.identity!r}; reading them in {SETTLE_SECONDS} s.")
    time.sleep(SETTLE_SECONDS)
    try:
        _refuse_equal_priority(api, peering, _now())
    except PriorityTaken:
        for path in peering.paths():
            api.merge_patch(path, {"status": {peering.identity: None}})
        raise


def _refuse_equal_priority(api: KubeApi, peering: Peering, now: datetime.datetime) -> None:
    for path in peering.paths():
        live = live_priorities(api.read(path), peering.identity, now)
        same = sorted(peer for peer, priority in live.items() if priority == peering.priority)
        if same:
            raise PriorityTaken(
                f"live peers {same} in {path} have this replica's priority {peering.priority}:"
                " kopf would pause every one of them; give each replica its own --priority"
                " (or none: a random one)"
            )


def announce_from_memo(memo: kopf.Memo, logger: logging.Logger) -> None:
    """The start-up gate of a replica that has peers (`memo.peering`, set by the CLI); nothing
    for a standalone operator."""
    peering = getattr(memo, "peering", None)
    if peering is not None:
        announce_and_settle(KubeApi.from_environment(), peering, logger)
