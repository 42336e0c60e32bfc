"""The router's prefetch planner against a real engine rank, and through a real router.

The planner is driven on a manual clock with `run_due()` (its worker not started), so the
timing rule is checked exactly: no prefetch before a conversation's first gap is seen, none
before half its shortest gap has passed, one after; a turn waiting for its pinned home makes
that home onboard the waiting prompt at once. The last test runs the whole router.
"""

from __future__ import annotations

import random

import grpc
import pytest
from engine_testkit import (
    greedy,
    run_call,
    shared_compute,
    tokens_of,
    turn_two,
    two_turns,
    wait_until,
)
from kvfleet.proto import common_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.model.tokenizer import ByteTokenizer
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.engine.rank.grpc_service import create_engine_server
from kvfleet.services.engine.request.engine_request import GenerateCall
from kvfleet.services.router.model import PendingRequest, RankInfo
from kvfleet.services.router.prefetch import PrefetchPlanner
from kvfleet.services.router.server import RouterConfig, create_server
from kvfleet.services.router.store import LocalStore

CONFIG = EngineConfig(
    model="tiny",
    max_batch_size=2,
    max_num_batched_tokens=64,
    page_size=16,
    kv_pages=24,
    reuse_policy="per_request",
    checkpoint_margin_tokens=32,
    host_kv_pages=64,
)


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rank():
    """A started core behind a real engine gRPC server; (core, address, stub factory)."""
    core = EngineCore(CONFIG, compute=shared_compute(CONFIG, "router-prefetch")).start()
    server, _, port, _ = create_engine_server("127.0.0.1:0", core, ByteTokenizer())
    channels: list[grpc.Channel] = []

    def stub_of(address: str) -> engine_pb2_grpc.EngineStub:
        channels.append(grpc.insecure_channel(address))
        return engine_pb2_grpc.EngineStub(channels[-1])

    try:
        yield core, f"127.0.0.1:{port}", stub_of
    finally:
        for channel in channels:
            channel.close()
        server.stop(None)
        core.stop()


def _pushed_to_host(core: EngineCore, seed: int) -> tuple[GenerateCall, GenerateCall]:
    """Turn 1 of a conversation, then a flood that moves its blocks to host; turn 2's call."""
    first, appended = two_turns(seed, "g")
    second = turn_two(first, tokens_of(run_call(core, first)), appended)
    rng = random.Random(seed)
    for i in range(3):
        prompt = tuple(rng.randrange(256) for _ in range(320))
        run_call(core, GenerateCall(f"flood-{seed}-{i}", prompt, greedy(4), f"flood-{seed}-{i}"))
    return first, second


def _holds(core: EngineCore) -> int:
    return core.call_on_core(lambda: len(core.scheduler.holds))


def test_turn_end_prefetch_waits_for_the_conversations_own_gap(rank):
    """Sent early, a hold takes memory long before the turn; never sent, the turn onboards."""
    core, address, stub_of = rank
    clock = ManualClock()
    planner = PrefetchPlanner(stub_of, clock, wait_bound_s=30)
    first, _ = _pushed_to_host(core, seed=7)
    conversation = first.conversation_id
    planner.turn_ended(conversation, address)
    clock.now += 4.0
    assert planner.run_due() == 0  # no gap seen yet: nothing to time it by
    planner.turn_arrived(conversation)  # turn 2, 4 s after turn 1 ended
    planner.turn_ended(conversation, address)
    clock.now += 1.9
    assert planner.run_due() == 0  # before half the shortest gap (2 s)
    clock.now += 0.2
    assert planner.run_due() == 1
    assert (planner.sent, planner.failed) == (1, 0)
    assert _holds(core) == 1
    core.check_integrity()


def test_a_turn_waiting_for_its_home_is_onboarded_there_at_once(rank):
    """Without it a deferred turn onboards its prefix only once admitted."""
    core, address, stub_of = rank
    clock = ManualClock()
    planner = PrefetchPlanner(stub_of, clock, wait_bound_s=30)
    store = LocalStore()
    store.register_rank(RankInfo("rank-0", address, 2), clock())
    _, second = _pushed_to_host(core, seed=8)
    conversation = second.conversation_id
    assert store.try_admit("rank-0", "earlier", 1, conversation, 3600, clock())
    waiting = [PendingRequest("w1", conversation, clock(), prompt_tokens=second.prompt_token_ids)]
    planner.after_pass(waiting, store, store_ranks(store), clock())
    planner.after_pass(waiting, store, store_ranks(store), clock())  # asked once per request
    assert planner.run_due() == 1
    assert _holds(core) == 1
    outputs = run_call(core, second)
    assert outputs[-1].usage.cached_tokens >= 9 * 16
    assert _holds(core) == 0  # the admitted turn took the hold over
    core.check_integrity()


def store_ranks(store: LocalStore) -> dict:
    return {rank_id: slots for rank_id, (slots, _) in store.snapshot().items()}


def test_router_sends_prefetches_to_the_home_rank_after_a_turn():
    """A router that never asks leaves every returning turn to onboard at admission."""
    router, port = create_server("127.0.0.1:0", RouterConfig(prefetch=True))
    address = f"127.0.0.1:{port}"
    engine = EngineRank(CONFIG, RankAddresses(router=address, rank_id="rank-0")).start()
    channel = grpc.insecure_channel(address)
    try:
        assert engine.link.registered.wait(10)
        stub = router_pb2_grpc.RouterStub(channel)
        prompt = [random.Random(9).randrange(256) for _ in range(100)]
        for turn in range(3):
            request = router_pb2.GenerateRequest(
                conversation_id="c9",
                prompt_token_ids=common_pb2.TokenIds(ids=prompt),
                sampling=common_pb2.SamplingParams(temperature=0.0),
                max_tokens=4,
            )
            list(stub.Generate(request, timeout=30))
            prompt = prompt + [turn + 1] * 20
        planner = router.prefetch
        wait_until(lambda: planner.sent >= 1, timeout=20)
        assert planner.failed == 0
    finally:
        channel.close()
        engine.core.check_integrity()
        engine.stop(grace=0.5)
        router.stop(grace=0.5)


def test_router_without_prefetch_has_no_planner():
    """The switch off (the default) must leave the router as it was (no thread, no calls)."""
    router, _ = create_server("127.0.0.1:0", RouterConfig())
    try:
        assert router.prefetch is None
    finally:
        router.stop(grace=0.5)
