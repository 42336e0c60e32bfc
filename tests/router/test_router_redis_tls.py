"""Redis over TLS (`rediss://`): the router trusts the CA it is given and keeps its pins there;
one that does not trust the server's certificate serves degraded rather than in the clear."""

from __future__ import annotations

import pytest
from kvfleet.services.router.server import RouterConfig
from own_redis import OwnRedis
from test_router_redis_auth import serve_one_turn


@pytest.fixture
def tls_redis(certificate):
    cert, key = certificate
    instance = OwnRedis(tls=(str(cert), str(key)))
    instance.start()
    yield instance
    instance.stop()


def test_the_router_keeps_its_pins_in_a_tls_redis(tls_redis):
    config = RouterConfig(
        redis_url=tls_redis.url, redis_prefix="tls", redis_ca_file=tls_redis.tls[0]
    )
    rank, degraded, errors = serve_one_turn(config)
    assert (rank, degraded, errors) == ("r0", False, 0)
    assert tls_redis.client().get("tls:pin:conv-auth") == "r0"


def test_a_router_that_does_not_trust_the_certificate_serves_degraded(tls_redis):
    """Without the CA the handshake fails: no pin is written anywhere, the turn is still served."""
    rank, degraded, errors = serve_one_turn(RouterConfig(redis_url=tls_redis.url))
    assert (rank, degraded) == ("r0", True)
    assert errors >= 1
    assert tls_redis.client().get("kvfleet:pin:conv-auth") is None
