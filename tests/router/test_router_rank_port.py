"""The rank-facing door: its own port, a fleet secret, no re-pointing a live rank; TLS."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.router.fleet_secret import SECRET_ENV, secret_metadata
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until

SECRET = "fleet-secret-for-tests"


@pytest.fixture
def router():
    config = RouterConfig(rank_address="127.0.0.1:0", fleet_secret=SECRET)
    server, port = create_server("127.0.0.1:0", config)
    yield server, port
    server.stop(0)


def registration(rank_id="r0", address="127.0.0.1:1"):
    return router_pb2.RegisterRequest(rank_id=rank_id, address=address, max_batch_size=2)


@pytest.mark.parametrize("shown", [None, "wrong"])
def test_rank_calls_without_the_fleet_secret_are_refused(router, shown):
    """Anyone who reaches the router could register a rank and receive its traffic."""
    server, _port = router
    with grpc.insecure_channel(f"127.0.0.1:{server.rank_port}") as channel:
        registry = router_pb2_grpc.RankRegistryStub(channel)
        metadata = secret_metadata(shown)
        calls = (
            lambda: registry.Register(registration(), timeout=5, metadata=metadata),
            lambda: registry.Heartbeat(
                router_pb2.HeartbeatRequest(rank_id="r0"), timeout=5, metadata=metadata
            ),
            lambda: registry.PublishKvEvents(
                iter([router_pb2.KvEventBatch(rank_id="r0")]), timeout=5, metadata=metadata
            ),
        )
        for call in calls:
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert server.runtime.ranks() == {}


def test_the_registry_is_not_served_on_the_client_port(router):
    """Clients reach the client port; the rank registry must not be behind it."""
    _server, port = router
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        registry = router_pb2_grpc.RankRegistryStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            registry.Register(registration(), timeout=5, metadata=secret_metadata(SECRET))
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_live_rank_is_not_re_pointed_to_another_address(router):
    """A Register with a live rank's id would send its pinned conversations elsewhere."""
    server, _port = router
    engine = FakeEngine("r0", 2)
    engine.join(f"127.0.0.1:{server.rank_port}", secret=SECRET)
    try:
        wait_until(lambda: "r0" in server.runtime.ranks())
        with grpc.insecure_channel(f"127.0.0.1:{server.rank_port}") as channel:
            registry = router_pb2_grpc.RankRegistryStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                registry.Register(
                    registration(address="127.0.0.1:9"), timeout=5, metadata=secret_metadata(SECRET)
                )
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert caught.value.details().startswith("rank_id")
        assert server.runtime.ranks()["r0"].info.address == engine.address
    finally:
        engine.kill()


def test_a_live_ranks_capacity_is_not_changed_by_a_register(router):
    """A second Register with more slots would let the router overfill a rank whose requests
    hold reservations against the old size; the same registration again is welcome."""
    server, _port = router
    engine = FakeEngine("r0", 2)
    engine.join(f"127.0.0.1:{server.rank_port}", secret=SECRET)
    try:
        wait_until(lambda: "r0" in server.runtime.ranks())
        same = router_pb2.RegisterRequest(
            rank_id="r0", address=engine.address, max_batch_size=2, block_size=4,
            role=common_pb2.RANK_ROLE_BOTH,
        )  # fmt: skip
        bigger = router_pb2.RegisterRequest()
        bigger.CopyFrom(same)
        bigger.max_batch_size = 64
        with grpc.insecure_channel(f"127.0.0.1:{server.rank_port}") as channel:
            registry = router_pb2_grpc.RankRegistryStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                registry.Register(bigger, timeout=5, metadata=secret_metadata(SECRET))
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "max_batch_size 2 (asked 64)" in caught.value.details()
            registry.Register(same, timeout=5, metadata=secret_metadata(SECRET))
        assert server.runtime.ranks()["r0"].info.max_batch_size == 2
    finally:
        engine.kill()


def test_a_real_rank_registers_through_the_rank_port_with_the_secret(router, monkeypatch):
    """Ranks read the secret from the environment the Kubernetes Secret fills."""
    server, port = router
    monkeypatch.setenv(SECRET_ENV, SECRET)
    config = EngineConfig(model="tiny", max_batch_size=2, page_size=16, kv_pages=64)
    addresses = RankAddresses(router=f"127.0.0.1:{server.rank_port}", rank_id="real-0")
    rank = EngineRank(config, addresses).start()
    try:
        assert rank.link.registered.wait(30)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            request = router_pb2.GenerateRequest(
                prompt_token_ids=common_pb2.TokenIds(ids=[1, 2]), max_tokens=2
            )
            responses = list(router_pb2_grpc.RouterStub(channel).Generate(request, timeout=60))
        assert (responses[0].rank_id, responses[-1].chunk.finished) == ("real-0", True)
    finally:
        rank.stop(grace=0.5)


def test_the_router_command_will_not_open_a_rank_port_without_a_secret():
    """A deployment that forgot the Secret would serve an open registry."""
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    finished = subprocess.run(
        [sys.executable, "-m", "kvfleet.services.cli", "router", "--grpc-port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode != 0
    assert SECRET_ENV in finished.stderr


def test_the_client_port_serves_tls_with_the_given_certificate(certificate):
    """Optional TLS on the client port: a client trusting the certificate is served."""
    cert, key = certificate
    config = RouterConfig(
        tls_cert_file=str(cert), tls_key_file=str(key), rank_address="127.0.0.1:0"
    )
    server, port = create_server("127.0.0.1:0", config)
    engine = FakeEngine("r0", 2)
    engine.join(f"127.0.0.1:{server.rank_port}")
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    try:
        with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
            request = router_pb2.GenerateRequest(
                prompt_token_ids=common_pb2.TokenIds(ids=[1]), max_tokens=2
            )
            responses = list(router_pb2_grpc.RouterStub(channel).Generate(request, timeout=30))
        assert responses[-1].chunk.finished
    finally:
        engine.kill()
        server.stop(0)
