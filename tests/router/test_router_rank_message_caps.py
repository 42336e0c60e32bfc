"""The rank door reads nothing from a caller without the fleet secret, and no message larger
than its method needs."""

from __future__ import annotations

import grpc
import pytest
from kvfleet.proto import router_pb2, router_pb2_grpc
from kvfleet.services.engine.rank.router_link import split_batches
from kvfleet.services.router.fleet_secret import METHOD_MESSAGE_BYTES, secret_metadata
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until

SECRET = "fleet-secret-for-tests"
BIG = 70 * 1024 * 1024  # far past the rank port's cap, well inside the client port's
SEND_BIG = (("grpc.max_send_message_length", 2 * BIG),)


@pytest.fixture
def router():
    config = RouterConfig(rank_address="127.0.0.1:0", fleet_secret=SECRET)
    server, port = create_server("127.0.0.1:0", config)
    yield server, port
    server.stop(0)


def huge_registration() -> router_pb2.RegisterRequest:
    return router_pb2.RegisterRequest(rank_id="r0", address="x" * BIG, max_batch_size=2)


def test_an_unauthenticated_body_is_never_read(router):
    """Read first and refused after, 70 MB calls would grow the router's memory unchecked (here:
    a body read against the rank port's cap would fail RESOURCE_EXHAUSTED instead)."""
    server, _port = router
    with grpc.insecure_channel(f"127.0.0.1:{server.rank_port}", options=SEND_BIG) as channel:
        registry = router_pb2_grpc.RankRegistryStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            registry.Register(huge_registration(), timeout=60, metadata=secret_metadata("wrong"))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert server.runtime.ranks() == {}


@pytest.mark.parametrize("rank_port", [True, False])
def test_a_registration_over_its_cap_is_refused_by_name(rank_port):
    """A Register needs a few hundred bytes; on the client port (an in-process fleet) a 100 kB
    one must be refused too, naming the method and the cap, and a legal one still served."""
    config = RouterConfig(rank_address="127.0.0.1:0" if rank_port else None, fleet_secret=SECRET)
    server, port = create_server("127.0.0.1:0", config)
    door = server.rank_port if rank_port else port
    cap = METHOD_MESSAGE_BYTES["/kvfleet.RankRegistry/Register"]
    engine = FakeEngine("r1", 2)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{door}") as channel:
            registry = router_pb2_grpc.RankRegistryStub(channel)
            padded = router_pb2.RegisterRequest(rank_id="r0", address="x" * (cap + 1))
            with pytest.raises(grpc.RpcError) as caught:
                registry.Register(padded, timeout=30, metadata=secret_metadata(SECRET))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert caught.value.details().startswith("/kvfleet.RankRegistry/Register")
        assert str(cap) in caught.value.details()
        engine.join(f"127.0.0.1:{door}", secret=SECRET)
        wait_until(lambda: set(server.runtime.ranks()) == {"r1"})
    finally:
        engine.kill()
        server.stop(0)


@pytest.mark.parametrize("rank_port", [True, False])
def test_an_oversized_kv_batch_ends_the_stream_with_resource_exhausted(rank_port):
    """A batch over the cap the ranks cut theirs to is refused, not applied (on the client
    port of an in-process fleet too, where the transport would take 80 MiB)."""
    config = RouterConfig(rank_address="127.0.0.1:0" if rank_port else None, fleet_secret=SECRET)
    server, port = create_server("127.0.0.1:0", config)
    door = server.rank_port if rank_port else port
    engine = FakeEngine("r0", 2)
    engine.join(f"127.0.0.1:{door}", secret=SECRET)
    try:
        wait_until(lambda: "r0" in server.runtime.ranks())
        cap = METHOD_MESSAGE_BYTES["/kvfleet.RankRegistry/PublishKvEvents"]
        removed = router_pb2.BlocksRemoved(block_hashes=[2**63 + i for i in range(cap // 8)])
        batch = router_pb2.KvEventBatch(rank_id="r0", events=[router_pb2.KvEvent(removed=removed)])
        with grpc.insecure_channel(f"127.0.0.1:{door}", options=SEND_BIG) as channel:
            registry = router_pb2_grpc.RankRegistryStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                registry.PublishKvEvents(
                    iter([batch]), timeout=30, metadata=secret_metadata(SECRET)
                )
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert server.runtime.prefix_index.block_count("r0") == 0
    finally:
        engine.kill()
        server.stop(0)


def test_a_ranks_kv_batches_fit_the_routers_cap():
    """A rank that sent one batch per engine step would see a long prompt's commit refused."""
    stored = [
        router_pb2.KvEvent(
            stored=router_pb2.BlocksStored(block_hashes=[2**63 + i], token_ids=[99_999] * 64)
        )
        for i in range(40_000)
    ]
    batches = list(split_batches("r0", stored))
    cap = METHOD_MESSAGE_BYTES["/kvfleet.RankRegistry/PublishKvEvents"]
    assert len(batches) > 1
    assert all(batch.ByteSize() <= cap for batch in batches)
    assert [e for batch in batches for e in batch.events] == stored
