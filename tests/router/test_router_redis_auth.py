"""Redis with a password (AUTH), and through Sentinel: the router logs in and shares state."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest
import redis
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.fleet_secret import SECRET_ENV
from kvfleet.services.router.redis_connect import URL_ENV
from kvfleet.services.router.server import RouterConfig, create_server
from own_redis import OwnRedis, free_port
from router_fake_engine import FakeEngine, wait_until
from router_process import TEST_FLEET_SECRET

PASSWORD = "redis-password-for-tests"


@pytest.fixture
def locked_redis():
    instance = OwnRedis(password=PASSWORD)
    instance.start()
    yield instance
    instance.stop()


def serve_one_turn(config: RouterConfig) -> tuple[str, bool, float]:
    """One turn through a router with this config: (its rank, degraded after, redis errors)."""
    server, port = create_server("127.0.0.1:0", config)
    engine = FakeEngine("r0", 2)
    engine.join(f"127.0.0.1:{port}")
    try:
        wait_until(lambda: "r0" in server.runtime.ranks())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            request = router_pb2.GenerateRequest(
                conversation_id="conv-auth",
                prompt_token_ids=common_pb2.TokenIds(ids=[1]),
                max_tokens=1,
            )
            responses = list(router_pb2_grpc.RouterStub(channel).Generate(request, timeout=10))
        return (
            responses[0].rank_id,
            server.runtime.degraded,
            server.metrics.redis_errors._value.get(),
        )
    finally:
        engine.kill()
        server.stop(0)


def test_the_router_logs_in_to_a_redis_with_a_password(locked_redis):
    """A router that cannot AUTH would serve from local state only (no shared pins)."""
    url = f"redis://127.0.0.1:{locked_redis.port}/0"
    config = RouterConfig(redis_url=url, redis_prefix="auth", redis_password=PASSWORD)
    rank, degraded, errors = serve_one_turn(config)
    assert (rank, degraded, errors) == ("r0", False, 0)
    assert locked_redis.client().get("auth:pin:conv-auth") == "r0"


def test_without_the_password_the_router_serves_degraded(locked_redis):
    """The password is what lets it in: without it Redis refuses every call."""
    url = f"redis://127.0.0.1:{locked_redis.port}/0"
    rank, degraded, errors = serve_one_turn(RouterConfig(redis_url=url, redis_prefix="noauth"))
    assert (rank, degraded) == ("r0", True)
    assert errors >= 1


def test_the_router_finds_the_master_through_sentinel(locked_redis, tmp_path):
    """HA Redis: the router asks Sentinel for the master and logs in there."""
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\n"
        f"sentinel monitor kvmaster 127.0.0.1 {locked_redis.port} 1\n"
        f"sentinel auth-pass kvmaster {PASSWORD}\n"
    )
    sentinel = subprocess.Popen(
        ["redis-server", str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        probe = redis.Redis(port=port, decode_responses=True, socket_timeout=1)

        def knows_master() -> bool:
            try:
                return probe.sentinel_get_master_addr_by_name("kvmaster") is not None
            except redis.RedisError:
                return False

        wait_until(knows_master)
        probe.close()
        config = RouterConfig(
            redis_sentinels=(f"127.0.0.1:{port}",),
            redis_sentinel_master="kvmaster",
            redis_password=PASSWORD,
            redis_prefix="sentinel",
        )
        rank, degraded, errors = serve_one_turn(config)
        assert (rank, degraded, errors) == ("r0", False, 0)
        assert locked_redis.client().get("sentinel:pin:conv-auth") == "r0"
    finally:
        sentinel.terminate()
        sentinel.wait(timeout=10)


def test_a_wrong_password_shows_on_health_and_nowhere_else(locked_redis):
    """A router refused by Redis serves degraded for good: /health must say why (the operator
    cannot tell otherwise), and the password, given in $KVFLEET_REDIS_URL, must not show on its
    command line nor in its output."""
    wrong = "wrong-password-for-tests"
    process = subprocess.Popen(
        [sys.executable, "-m", "kvfleet.services.cli", "router", "--host", "127.0.0.1",
         "--grpc-port", "0", "--rank-port", "0", "--metrics-port", "-1", "--http-port", "0",
         "--redis-prefix", "wrongpw"],
        env={**os.environ, SECRET_ENV: TEST_FLEET_SECRET,
             URL_ENV: f"redis://:{wrong}@127.0.0.1:{locked_redis.port}/0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    output = []
    try:
        port = None
        for line in process.stdout:
            output.append(line)
            if match := re.search(r"http port (\d+)", line):
                port = int(match.group(1))
                break
        assert port is not None, "".join(output)
        assert wrong not in Path(f"/proc/{process.pid}/cmdline").read_text()

        def health() -> dict:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()

        wait_until(lambda: health().get("redis") == "degraded", timeout=30)
        body = health()
        assert "AuthenticationError" in body["redis_error"], body
        assert wrong not in body["redis_error"]
    finally:
        process.terminate()
        output.append(process.communicate(timeout=60)[0])
    assert wrong not in "".join(output)
