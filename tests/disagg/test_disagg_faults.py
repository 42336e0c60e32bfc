"""Faults of a hand-off: context rank lost, hold expired, generation rank lost mid-decode."""

from __future__ import annotations

import grpc
import pytest
from disagg_kit import (
    address,
    assert_clean,
    engine_request,
    engine_stub,
    metric,
    received_blocks,
    router_generate,
    start_rank,
    start_router,
    tokens,
    tracked_requests,
    wait_until,
)
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc

PROMPT = list(range(7, 90))  # 83 tokens: 5 full blocks and a partial one


def _prefill(context_rank, request_id: str, prompt=PROMPT, max_tokens: int = 8):
    """Run the context half directly; returns the hand-off chunk."""
    channel, stub = engine_stub(context_rank)
    with channel:
        chunks = list(stub.Generate(engine_request(request_id, prompt, max_tokens), timeout=30))
    assert [c.finish_reason for c in chunks] == ["handoff"]
    return chunks[0]


def _decode(
    generation_rank, request_id: str, source: str, first, prompt=PROMPT, max_tokens=8, **extra
):
    channel, stub = engine_stub(generation_rank)
    with channel:
        request = engine_request(
            request_id,
            prompt,
            max_tokens,
            kv_source_address=source,
            handoff_token_ids=list(first.token_ids),
            **extra,
        )
        return list(stub.Generate(request, timeout=30))


def _aggregated(rank, request_id: str, prompt=PROMPT, max_tokens: int = 8) -> list[int]:
    channel, stub = engine_stub(rank)
    with channel:
        return tokens(stub.Generate(engine_request(request_id, prompt, max_tokens), timeout=30))


@pytest.fixture
def disk_dir(tmp_path):
    return str(tmp_path / "disk-tier")


def test_context_rank_lost_after_prefill_completes_from_the_shared_disk(disk_dir):
    """Without the disk fallback a lost context rank would lose every parked turn."""
    context = start_rank("context", disk_tier_dir=disk_dir)
    generation = start_rank("generation", disk_tier_dir=disk_dir)
    both = start_rank("both")
    try:
        first = _prefill(context, "lost-1")
        source = address(context)
        context.stop(grace=0.1)
        chunks = _decode(generation, "lost-1", source, first)
        assert [*first.token_ids, *tokens(chunks)] == _aggregated(both, "agg-1")
        assert metric(generation, "kvfleet_engine_handoff_failures_total", transport="grpc") == 1
        # The generation rank's own disk tier matched the 5 full blocks the context rank wrote
        # through, so they are held and skipped (5 `full` + 4 `window`); the hand-off read
        # only the partial block of each life cycle from disk.
        assert metric(generation, "kvfleet_engine_handoff_blocks_skipped_total") == 9
        assert received_blocks(generation, "disk") == 2
        assert_clean(generation)
        assert_clean(both)
    finally:
        for rank in (generation, both):
            rank.stop(grace=0.1)


def test_context_rank_lost_without_a_disk_tier_fails_with_aborted_naming_the_transport():
    """A vague or UNAVAILABLE status would make the router drop a healthy generation rank."""
    context = start_rank("context")
    generation = start_rank("generation")
    try:
        first = _prefill(context, "lost-2")
        source = address(context)
        context.stop(grace=0.1)
        with pytest.raises(grpc.RpcError) as caught:
            _decode(generation, "lost-2", source, first)
        assert caught.value.code() == grpc.StatusCode.ABORTED
        assert "KV hand-off from" in caught.value.details()
        assert "grpc: PullKvBlocks" in caught.value.details()
        assert_clean(generation)
    finally:
        generation.stop(grace=0.1)


def test_a_generation_call_pulls_the_kv_parked_under_the_context_attempts_own_id():
    """A router that retried the context half parks the KV under the attempt's id (`id~2`) and
    sends the generation rank the turn's: without kv_source_request_id the pull asks for an
    id the context rank never had and fails NOT_FOUND."""
    context = start_rank("context")
    generation = start_rank("generation")
    aggregated = start_rank("both")
    try:
        first = _prefill(context, "moved~2")
        chunks = _decode(
            generation, "moved", address(context), first, kv_source_request_id="moved~2"
        )
        assert [*first.token_ids, *tokens(chunks)] == _aggregated(aggregated, "alone")
        assert {c.request_id for c in chunks} == {"moved"}
        wait_until(lambda: tracked_requests(context) == ())  # the hold was pulled and let go
        assert_clean(context)
        assert_clean(generation)
    finally:
        for rank in (context, generation, aggregated):
            rank.stop(grace=0.1)


def test_hold_that_times_out_is_released_and_the_late_pull_fails_clearly():
    """A hold that never expires leaks the context rank's pages when no one pulls."""
    context = start_rank("context", handoff_hold_seconds=0.2)
    generation = start_rank("generation")
    try:
        first = _prefill(context, "late-1")
        assert tracked_requests(context) == ("late-1#0",)
        wait_until(lambda: tracked_requests(context) == ())
        assert metric(context, "kvfleet_engine_handoff_expired_total") == 1
        with pytest.raises(grpc.RpcError) as caught:
            _decode(generation, "late-1", address(context), first)
        assert caught.value.code() == grpc.StatusCode.ABORTED
        assert "NOT_FOUND" in caught.value.details()
        assert_clean(context)
        assert_clean(generation)
    finally:
        for rank in (context, generation):
            rank.stop(grace=0.1)


def test_generation_rank_lost_mid_decode_fails_unavailable_and_leaks_nothing():
    """A silent truncation, or a context hold left behind, would be a lost or leaked turn."""
    router, router_address = start_router()
    context = start_rank("context", router_address)
    generation = start_rank("generation", router_address, max_num_batched_tokens=1)
    try:
        with grpc.insecure_channel(router_address) as channel:
            request = router_pb2.GenerateRequest(
                conversation_id="mid-decode",
                prompt_token_ids=common_pb2.TokenIds(ids=PROMPT),
                sampling=common_pb2.SamplingParams(temperature=0.0),
                max_tokens=400,
            )
            stream = router_pb2_grpc.RouterStub(channel).Generate(request, timeout=60)
            seen = []
            with pytest.raises(grpc.RpcError) as caught:
                for response in stream:
                    seen.append(response.rank_id)
                    if seen.count("generation") == 3:
                        generation.stop(grace=0)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "generation rank generation failed after" in caught.value.details()
        assert seen[0] == "context"
        assert_clean(context)
        router.runtime.store.check_integrity()
        assert "generation" not in router.runtime.ranks()
    finally:
        context.stop(grace=0.1)
        router.stop(grace=0.1)


def test_a_turn_with_no_generation_rank_fails_in_queue_and_its_hold_expires():
    """Decoding on a context rank would break the pools' split; a kept hold would leak pages."""
    router, router_address = start_router()
    context = start_rank("context", router_address, handoff_hold_seconds=0.3)
    try:
        router.runtime._max_queue_seconds = 0.2
        with pytest.raises(grpc.RpcError) as caught:
            router_generate(router_address, "no-gen", PROMPT)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        wait_until(lambda: tracked_requests(context) == ())
        assert metric(context, "kvfleet_engine_handoff_expired_total") == 1
        assert_clean(context)
    finally:
        context.stop(grace=0.1)
        router.stop(grace=0.1)
