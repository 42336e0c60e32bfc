"""Real ranks and routers for the disaggregation tests: the tiny model on CPU, fp32."""

from __future__ import annotations

import time

import grpc
from kvfleet.proto import common_pb2, engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.router.server import RouterConfig, create_server

# Small pools, a small step budget (chunked prefill), a short checkpoint margin: as the engine
# serving tests use.
CONFIG = EngineConfig(
    model="tiny",
    max_batch_size=4,
    max_num_batched_tokens=48,
    page_size=16,
    kv_pages=160,
    checkpoint_margin_tokens=32,
)


def start_rank(role: str, router: str | None = None, rank_id: str = "", **changes) -> EngineRank:
    """A started rank of `role` (registered with `router` when given)."""
    config = CONFIG.with_changes(role=role, **changes)
    rank = EngineRank(config, RankAddresses(router=router, rank_id=rank_id or role)).start()
    if router is not None and not rank.link.registered.wait(10):
        raise TimeoutError(f"rank {rank_id or role} did not register")
    return rank


def start_router():
    """An in-process router (local store); returns (server, address)."""
    server, port = create_server("127.0.0.1:0", RouterConfig())
    return server, f"127.0.0.1:{port}"


def address(rank: EngineRank) -> str:
    return f"127.0.0.1:{rank.grpc_port}"


def engine_stub(rank: EngineRank) -> tuple[grpc.Channel, engine_pb2_grpc.EngineStub]:
    channel = grpc.insecure_channel(address(rank))
    return channel, engine_pb2_grpc.EngineStub(channel)


def engine_request(request_id: str, prompt: list[int], max_tokens: int = 8, **fields):
    """A greedy EngineGenerateRequest of one sample."""
    return engine_pb2.EngineGenerateRequest(
        request_id=request_id,
        conversation_id=fields.pop("conversation_id", "conv"),
        prompt_token_ids=common_pb2.TokenIds(ids=prompt),
        sampling=common_pb2.SamplingParams(temperature=0.0),
        max_tokens=max_tokens,
        num_samples=1,
        **fields,
    )


def router_generate(
    router_address: str,
    conversation: str,
    prompt: list[int],
    max_tokens=8,
    sampling=None,
    rank_id: str | None = None,
    cache_salt: str = "",
):
    """Every response of one turn through the router (greedy unless `sampling` says; on
    `rank_id` when given; with `cache_salt`, in that tenant's cache)."""
    with grpc.insecure_channel(router_address) as channel:
        request = router_pb2.GenerateRequest(
            conversation_id=conversation,
            prompt_token_ids=common_pb2.TokenIds(ids=prompt),
            sampling=sampling or common_pb2.SamplingParams(temperature=0.0),
            max_tokens=max_tokens,
            rank_id=rank_id,
            cache_salt=cache_salt,
        )
        return list(router_pb2_grpc.RouterStub(channel).Generate(request, timeout=60))


def tokens(responses) -> list[int]:
    """Token ids of router responses or engine chunks, in order."""
    chunks = [r.chunk if hasattr(r, "chunk") else r for r in responses]
    return [t for chunk in chunks for t in chunk.token_ids]


def reference_tokens(prompt: list[int], **changes) -> list[int]:
    """Greedy tokens of `prompt` on a rank of its own (CONFIG with `changes`), computed from
    scratch: what a moved turn must produce whatever it reused."""
    config = CONFIG.with_changes(**changes)
    rank = EngineRank(config, RankAddresses(rank_id="reference")).start()
    try:
        with grpc.insecure_channel(address(rank)) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            chunks = list(stub.Generate(engine_request("ref", prompt), timeout=60))
        assert chunks[-1].usage.cached_tokens == 0
        return tokens(chunks)
    finally:
        rank.stop(grace=0)


def received_blocks(rank, transport: str = "grpc") -> float:
    """Blocks a rank received by hand-off over `transport`."""
    return metric(
        rank, "kvfleet_engine_handoff_blocks_total", direction="received", transport=transport
    )


def tracked_requests(rank: EngineRank) -> tuple[str, ...]:
    """Requests the rank's kvstore manager still tracks (holds pages for)."""
    return rank.core.call_on_core(rank.core.manager.request_ids)


def metric(rank: EngineRank, name: str, **labels) -> float:
    """A sample of the rank's Prometheus registry (0 when never recorded)."""
    return rank.metrics.registry.get_sample_value(name, labels or None) or 0.0


def assert_clean(rank: EngineRank) -> None:
    """Integrity holds and no request keeps pages (only retained turns may)."""
    rank.core.check_integrity()
    assert tracked_requests(rank) == ()


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.02) -> None:
    """Poll until predicate() is true; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)
