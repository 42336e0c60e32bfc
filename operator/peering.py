"""Leader election among operator replicas (kopf peering): how soon a standby takes over from a
leader that died without a word (kill -9, a lost node)."""

from __future__ import annotations

import kopf

# How long a replica's keep-alive record counts as alive. kopf re-writes each replica's record
# every `lifetime - randint(5, 10)` s (at least 1 s), and a standby takes over once the leader's
# newest record is `lifetime` old. So a leader killed u s after its last keep-alive is replaced
# `lifetime - u` s later, between lifetime - 10 and lifetime: with 12, within 12 s plus a watch
# round-trip (the target is 15 s), where kopf's default 60 took up to a minute. A live leader's
# record still has kopf's 5-10 s of slack for a slow PATCH before it would expire, whatever the
# lifetime; the price of a short one is a keep-alive PATCH every 2-7 s per replica.
PEERING_LIFETIME_SECONDS = 12


def peering_settings() -> kopf.OperatorSettings:
    """kopf settings for a replica that elects a leader with its peers."""
    settings = kopf.OperatorSettings()
    settings.peering.lifetime = PEERING_LIFETIME_SECONDS
    return settings
