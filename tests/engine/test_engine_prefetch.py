"""Router-driven prefetch on a real engine behind its gRPC server (`PrefetchConversation`).

A tiny device pool is flooded by other conversations, so a conversation's first turn leaves
the device for the host tier. A prefetch in the tool pause must bring it back before the next
turn, so that turn onboards nothing at its admission; memory pressure must cancel the hold
rather than hurt a request; bad input is INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import random
import time

import grpc
import pytest
from engine_testkit import final, greedy, run_call, shared_compute, tokens_of, turn_two, two_turns
from kvfleet.kvstore.tiers.metrics import HOST
from kvfleet.proto import common_pb2, engine_pb2, engine_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.model.tokenizer import ByteTokenizer
from kvfleet.services.engine.rank.grpc_service import create_engine_server
from kvfleet.services.engine.request.engine_request import GenerateCall

PAGE = 16
CONFIG = EngineConfig(
    model="tiny",
    max_batch_size=2,
    max_num_batched_tokens=64,
    page_size=PAGE,
    kv_pages=24,
    reuse_policy="per_request",  # finished prefixes stay cached (LRU), so floods evict them
    checkpoint_margin_tokens=32,
    host_kv_pages=64,
)


@pytest.fixture
def served():
    """A started core behind a real engine gRPC server on a loopback port; its stub."""
    core = EngineCore(CONFIG, compute=shared_compute(CONFIG, "prefetch")).start()
    server, _, port, _ = create_engine_server("127.0.0.1:0", core, ByteTokenizer())
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield core, engine_pb2_grpc.EngineStub(channel)
    finally:
        channel.close()
        server.stop(None)
        core.stop()


def _flood(core: EngineCore, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(3):
        prompt = tuple(rng.randrange(256) for _ in range(320))
        run_call(core, GenerateCall(f"flood-{seed}-{i}", prompt, greedy(4), f"flood-{seed}-{i}"))


def _host_hits(core: EngineCore) -> int:
    return core.call_on_core(lambda: core.manager.tiers.metrics[HOST].hits)


def test_prefetch_in_the_pause_brings_the_prefix_up_before_the_turn(served):
    """Without the prefetch the second turn onboards its prefix from host at admission."""
    core, stub = served
    first, appended = two_turns(3, "p")
    second = turn_two(first, tokens_of(run_call(core, first)), appended)
    _flood(core, seed=31)
    reply = stub.PrefetchConversation(
        engine_pb2.PrefetchRequest(conversation_id=first.conversation_id, hold_seconds=60)
    )
    assert reply.held and reply.host_blocks >= 9, reply
    hits_before = _host_hits(core)
    outputs = run_call(core, second)
    assert final(outputs).usage.cached_tokens >= 9 * PAGE
    assert _host_hits(core) == hits_before  # nothing left to onboard: the hold had it
    assert core.call_on_core(lambda: len(core.scheduler.holds)) == 0  # the turn took it over
    core.check_integrity()


def test_memory_pressure_cancels_a_hold_before_any_request_suffers(served):
    """A hold that outlived pressure would starve the flood (refused or preempted requests)."""
    core, stub = served
    first, _ = two_turns(4, "q")
    run_call(core, first)
    prompt = common_pb2.TokenIds(ids=list(first.prompt_token_ids))
    reply = stub.PrefetchConversation(
        engine_pb2.PrefetchRequest(
            conversation_id=first.conversation_id, hold_seconds=60, prompt_token_ids=prompt
        )
    )
    assert reply.held
    _flood(core, seed=41)
    holds = core.scheduler.holds
    assert core.call_on_core(lambda: (len(holds), holds.cancelled)) == (0, 1)
    assert core.scheduler.preemptions == 0
    core.check_integrity()


def test_a_hold_expires_after_its_seconds(served):
    """A hold that never ends would keep pages the router no longer expects to be used."""
    core, stub = served
    first, _ = two_turns(5, "r")
    run_call(core, first)
    request = engine_pb2.PrefetchRequest(conversation_id=first.conversation_id, hold_seconds=0.05)
    assert stub.PrefetchConversation(request).held
    holds = core.scheduler.holds
    # Past the hold's seconds before any step runs: a quick tick must not beat the clock.
    time.sleep(0.1)
    run_call(core, GenerateCall("tick", (1, 2, 3), greedy(4), "other"))  # steps run expire()
    assert core.call_on_core(lambda: len(holds)) == 0
    core.check_integrity()


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"conversation_id": "", "hold_seconds": 5}, "conversation_id"),
        ({"conversation_id": "c", "hold_seconds": 0}, "hold_seconds"),
        ({"conversation_id": "c", "hold_seconds": float("nan")}, "hold_seconds"),
    ],
)
def test_bad_prefetch_is_invalid_argument_naming_the_field(served, request_fields, field):
    """A bad prefetch must be the client's 4xx-like error, never an internal one."""
    _, stub = served
    with pytest.raises(grpc.RpcError) as raised:
        stub.PrefetchConversation(engine_pb2.PrefetchRequest(**request_fields))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert field in raised.value.details()


def test_prefetch_of_an_unknown_conversation_holds_nothing(served):
    """A hold over nothing would take pages for no reuse."""
    _, stub = served
    reply = stub.PrefetchConversation(
        engine_pb2.PrefetchRequest(conversation_id="never-seen", hold_seconds=5)
    )
    assert not reply.held
