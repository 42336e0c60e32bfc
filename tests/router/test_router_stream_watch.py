"""Streams from a hung engine end (idle timeout); calls to a removed rank are cancelled."""

from __future__ import annotations

import threading

import grpc
import pytest
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.admission import AdmissionConfig
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until


def turn(conversation, max_tokens=3, **kwargs):
    return router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3]),
        max_tokens=max_tokens,
        **kwargs,
    )


@pytest.fixture
def start_fleet():
    started = []

    def start(**config):
        server, port = create_server("127.0.0.1:0", RouterConfig(**config))
        engines = [FakeEngine("r0", 2), FakeEngine("r1", 2)]
        for engine in engines:
            engine.join(f"127.0.0.1:{port}")
        wait_until(lambda: len(server.runtime.ranks()) == 2)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        started.append((server, engines, channel))
        return server, router_pb2_grpc.RouterStub(channel), engines

    yield start
    for server, engines, channel in started:
        channel.close()
        for engine in engines:
            engine.release.set()
            engine.kill()
        server.stop(0)


def pin_to_r0(stub, conversation: str) -> None:
    list(stub.Generate(turn(conversation, max_tokens=1, rank_id="r0"), timeout=10))


# Long enough that a healthy stream never idles this long, even through the garbage
# collection pauses of a loaded machine; short enough that a hung one is seen soon.
STREAM_IDLE_SECONDS = 3.0
# A healthy fake rank heartbeats every 0.1 s: only one that stopped misses this timeout.
HEARTBEAT_TIMEOUT_SECONDS = 5.0


def test_an_engine_hung_before_output_is_left_for_another_rank(start_fleet):
    """A hung engine's stream would hang its client until the client's own deadline."""
    server, stub, (r0, _r1) = start_fleet(stream_idle_seconds=STREAM_IDLE_SECONDS)
    pin_to_r0(stub, "conv-hung")
    r0.hang_after = 0
    responses = list(stub.Generate(turn("conv-hung"), timeout=60))
    assert (responses[0].rank_id, responses[-1].chunk.finished) == ("r1", True)
    assert server.metrics.retries._value.get() == 1


def test_an_engine_hung_mid_stream_fails_its_client_with_unavailable(start_fleet):
    """Once chunks were streamed the request cannot move: the client must learn at once."""
    _server, stub, (r0, _r1) = start_fleet(stream_idle_seconds=STREAM_IDLE_SECONDS)
    pin_to_r0(stub, "conv-mid")
    r0.hang_after = 2
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(turn("conv-mid", max_tokens=5), timeout=60))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "after 2 chunks" in caught.value.details()


def test_calls_in_flight_to_a_removed_rank_are_cancelled(start_fleet):
    """A rank removed for missed heartbeats would keep streaming to (or hanging) its clients;
    a call that streamed nothing yet is placed on another rank."""
    server, stub, (r0, _r1) = start_fleet(
        admission=AdmissionConfig(heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_SECONDS),
        stream_idle_seconds=600.0,
    )
    pin_to_r0(stub, "conv-a")
    pin_to_r0(stub, "conv-b")
    r0.hang_after = 1  # conv-a gets one chunk, conv-b none (it waits behind the same hang)
    outcome: dict = {}

    def run(conversation: str) -> None:
        try:
            outcome[conversation] = list(
                stub.Generate(turn(conversation, max_tokens=3), timeout=60)
            )
        except grpc.RpcError as error:
            outcome[conversation] = error

    first = threading.Thread(target=run, args=("conv-a",))
    first.start()
    wait_until(lambda: r0.hanging.is_set())
    r0.hang_after = 0
    r0.hanging.clear()
    second = threading.Thread(target=run, args=("conv-b",))
    second.start()
    wait_until(lambda: r0.hanging.is_set() and len(r0.served) == 4)
    r0.stop_heartbeats()
    first.join(timeout=60)
    second.join(timeout=60)
    assert isinstance(outcome["conv-a"], grpc.RpcError)
    assert outcome["conv-a"].code() == grpc.StatusCode.UNAVAILABLE
    assert "removed" in outcome["conv-a"].details()
    assert outcome["conv-b"][0].rank_id == "r1"
    assert outcome["conv-b"][-1].chunk.finished
    assert server.metrics.ranks_removed._value.get() == 1


def test_a_retry_on_the_rank_that_still_holds_the_attempt_before_is_served(start_fleet):
    """If this fails, a turn whose stream went idle is placed again with the request id of
    the attempt it replaces; when the retry lands on the same rank before that rank has
    dropped the cancelled attempt (its core learns of a cancel between steps), the rank
    refuses it as already running, and the client gets INVALID_ARGUMENT for a good turn."""
    server, stub, (r0, r1) = start_fleet(stream_idle_seconds=STREAM_IDLE_SECONDS)
    r1.kill()  # the retry can only go back to r0 once it registers again
    wait_until(lambda: list(server.runtime.ranks()) == ["r0"])
    r0.hang_after, r0.hang_times, r0.late_cancel_s = 0, 1, 10.0
    responses = list(stub.Generate(turn("conv-retried"), timeout=60))
    assert {r.rank_id for r in responses} == {"r0"}
    assert responses[-1].chunk.finished
    assert server.metrics.retries._value.get() == 1
    first, retry = r0.served
    assert retry != first  # the retry's own id on the rank, the turn's own to its client
    assert {r.chunk.request_id for r in responses} == {first}
