"""Prefix placement keys a tenant's blocks by its cache salt, as the engine does: one tenant's
prompt never steers another's, so which rank answers shows nothing of another tenant's prefix.
Real engine ranks (tiny model) publish their KV events to a real router."""

from __future__ import annotations

import grpc
import pytest
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.router.admission import AdmissionConfig
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import wait_until

pytestmark = pytest.mark.slow
PROMPT = list(range(40, 40 + 80))  # five blocks of 16


@pytest.fixture(scope="module")
def fleet():
    config = RouterConfig(admission=AdmissionConfig(placement="prefix"))
    server, port = create_server("127.0.0.1:0", config)
    engine = EngineConfig(model="tiny", max_batch_size=2, page_size=16, kv_pages=64)
    ranks = [
        EngineRank(engine, RankAddresses(router=f"127.0.0.1:{port}", rank_id=f"rank-{i}")).start()
        for i in range(2)
    ]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        for rank in ranks:
            assert rank.link.registered.wait(60)
        yield server, router_pb2_grpc.RouterStub(channel)
    finally:
        channel.close()
        for rank in ranks:
            rank.stop(grace=0.5)
        server.stop(0)


def serve(stub, conversation: str, salt: str, rank_id: str | None = None) -> str:
    """Run one turn; the rank that served it."""
    request = router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=PROMPT),
        max_tokens=2,
        cache_salt=salt,
    )
    if rank_id is not None:
        request.rank_id = rank_id
    responses = list(stub.Generate(request, timeout=60))
    assert responses[-1].chunk.finished
    return responses[0].rank_id


def test_another_tenants_prefix_does_not_steer_placement(fleet):
    """Keyed without the salt, tenant B's first turn would follow tenant A's identical prompt
    to rank-1 (and B could tell A had sent it); A's own next conversation still follows it."""
    server, stub = fleet
    assert serve(stub, "a-1", "tenant-a", rank_id="rank-1") == "rank-1"
    wait_until(lambda: server.runtime.prefix_index.block_count("rank-1") >= 5)
    assert serve(stub, "b-1", "tenant-b") == "rank-0"  # load order: rank-1 holds more KV
    assert serve(stub, "a-2", "tenant-a") == "rank-1"  # the prefix, for its own tenant
