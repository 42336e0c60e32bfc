"""Fixtures for the router tests: a fake clock, stores (in-process and on the shared Redis)."""

from __future__ import annotations

import uuid

import pytest
import redis
from kvfleet.services.router.redis_store import RedisStore
from kvfleet.services.router.store import LocalStore
from own_redis import OwnRedis
from router_fake_engine import SHARED_REDIS_URL


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def redis_prefix() -> str:
    return f"test-router-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_store(redis_prefix):
    client = redis.Redis.from_url(SHARED_REDIS_URL, decode_responses=True, socket_timeout=2)
    store = RedisStore(client, prefix=redis_prefix, owner="r1")
    yield store
    store.clear()
    client.close()


@pytest.fixture(params=["local", "redis"])
def store(request, redis_store):
    """Each admission test runs against both store implementations."""
    if request.param == "local":
        yield LocalStore()
    else:
        yield redis_store


@pytest.fixture
def own_redis():
    """A redis-server of the test's own, stopped at the end."""
    instance = OwnRedis()
    instance.start()
    yield instance
    instance.stop()
