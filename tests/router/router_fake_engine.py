"""A fake engine rank for router tests: a real gRPC Engine server with a controllable delay.

It registers with a router and heartbeats like a real rank, and counts the slots in use, so a
test can prove the router never sent it more than `max_batch_size`.
"""

from __future__ import annotations

import threading
import time

import grpc
from kvfleet.proto import common_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from kvfleet.proto.pooled_server import PooledServer
from kvfleet.services.router.fleet_secret import secret_metadata

# The shared Redis every test may use (unique key prefixes, cleaned up); never stopped.
SHARED_REDIS_URL = "redis://127.0.0.1:6379/0"


class FakeEngine(engine_pb2_grpc.EngineServicer):
    """Streams `prompt[-1] + 1, + 2, ...` one token per chunk, `delay` seconds apart."""

    def __init__(
        self,
        rank_id: str,
        max_batch_size: int,
        delay: float = 0.0,
        role: int = common_pb2.RANK_ROLE_BOTH,
        port: int = 0,
    ) -> None:
        self.rank_id = rank_id
        self.role = role
        # Set by a test: Generate fails with this status (`fail_times` calls; None: every one).
        self.fail_with: grpc.StatusCode | None = None
        self.fail_times: int | None = None
        # Set by a test: this many calls end the stream at once, sending nothing.
        self.end_early_times = 0
        # Set by a test: after this many chunks a call hangs (sends nothing) until `release`;
        # only the next `hang_times` calls (None: every one).
        self.hang_after: int | None = None
        self.hang_times: int | None = None
        # Set by a test: a hanging call that its caller cancelled keeps its request id this
        # long (a rank whose core learns of the cancel a step later). As the engine does, a
        # call whose request id is running is refused (INVALID_ARGUMENT).
        self.late_cancel_s = 0.0
        self._running_ids: set[str] = set()
        self.release = threading.Event()
        self._beating = threading.Event()
        self._beating.set()
        self.generate_calls = 0
        self.max_batch_size = max_batch_size
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0
        self.served: list[str] = []
        self.kv_sources: list[str] = []  # a generation call's kv_source_request_id
        self.first_chunk_sent = threading.Event()
        self.hanging = threading.Event()  # a call is hanging (see hang_after)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = PooledServer(32, f"fake-{rank_id}")
        engine_pb2_grpc.add_EngineServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        self.address = f"127.0.0.1:{self.port}"
        self._server.start()
        self._heartbeats: threading.Thread | None = None

    def Generate(self, request, context):
        slots = max(1, request.num_samples)
        with self._lock:
            duplicate = request.request_id in self._running_ids
            self._running_ids.add(request.request_id)
        if duplicate:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"request_id: {request.request_id!r} is running"
            )
        with self._lock:
            hangs = self.hang_after is not None and self.hang_times != 0
            if hangs and self.hang_times is not None:
                self.hang_times -= 1
            self.in_flight += slots
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.served.append(request.request_id)
            if request.kv_source_address:
                self.kv_sources.append(request.kv_source_request_id)
            self.generate_calls += 1
            failing = self.fail_with is not None and self.fail_times != 0
            if failing and self.fail_times is not None:
                self.fail_times -= 1
            ending_early = not failing and self.end_early_times > 0
            self.end_early_times -= ending_early
        try:
            if failing:
                context.abort(self.fail_with, f"fake engine {self.rank_id}: refused")
            if ending_early:
                return
            if self.role == common_pb2.RANK_ROLE_CONTEXT:
                yield self._handoff_chunk(request)
                return
            last = request.prompt_token_ids.ids[-1] if request.prompt_token_ids.ids else 0
            prompt_len = len(request.prompt_token_ids.ids) or len(request.prompt_text)
            sent = 0
            for sample in range(slots):
                for i in range(request.max_tokens):
                    if hangs and sent >= self.hang_after:
                        self.hanging.set()
                        while not (self.release.wait(0.05) or self._stop.is_set()):
                            if not context.is_active():
                                self._stop.wait(self.late_cancel_s)
                                return
                    if self._stop.wait(self.delay) or not context.is_active():
                        return
                    sent += 1
                    done = i == request.max_tokens - 1
                    usage = (
                        common_pb2.Usage(
                            prompt_tokens=prompt_len, completion_tokens=request.max_tokens
                        )
                        if done
                        else None
                    )
                    yield common_pb2.GenerationChunk(
                        request_id=request.request_id,
                        sample_index=sample,
                        token_ids=[last + i + 1],
                        finished=done,
                        finish_reason="length" if done else "",
                        usage=usage,
                    )
                    self.first_chunk_sent.set()
        finally:
            with self._lock:
                self.in_flight -= slots
                self._running_ids.discard(request.request_id)

    @staticmethod
    def _handoff_chunk(request) -> common_pb2.GenerationChunk:
        """A context rank's answer: the first token, finished with reason `handoff`."""
        last = request.prompt_token_ids.ids[-1] if request.prompt_token_ids.ids else 0
        return common_pb2.GenerationChunk(
            request_id=request.request_id,
            token_ids=[last + 1],
            finished=True,
            finish_reason="handoff",
            usage=common_pb2.Usage(prompt_tokens=len(request.prompt_token_ids.ids)),
        )

    def join(
        self, router_address: str, heartbeat_interval: float = 0.1, secret: str | None = None
    ) -> None:
        """Register with a router (showing the fleet secret, if any) and heartbeat until
        killed."""
        metadata = secret_metadata(secret)
        channel = grpc.insecure_channel(router_address)
        registry = router_pb2_grpc.RankRegistryStub(channel)
        registration = router_pb2.RegisterRequest(
            rank_id=self.rank_id,
            address=self.address,
            max_batch_size=self.max_batch_size,
            role=self.role,
            block_size=4,
        )
        registry.Register(registration, timeout=5, metadata=metadata)

        def beat() -> None:
            while not self._stop.wait(heartbeat_interval):
                if not self._beating.is_set():
                    continue
                try:
                    # A cancelled stream frees the router's slot before this engine's count
                    # drops, so a moment over its slots happens (the field is unsigned).
                    free = max(0, self.max_batch_size - self.in_flight)
                    load = router_pb2.RankLoad(free_slots=free)
                    reply = registry.Heartbeat(
                        router_pb2.HeartbeatRequest(rank_id=self.rank_id, load=load),
                        timeout=2,
                        metadata=metadata,
                    )
                    if not reply.registered:
                        registry.Register(registration, timeout=2, metadata=metadata)
                except grpc.RpcError:
                    continue
            channel.close()

        self._heartbeats = threading.Thread(target=beat, daemon=True)
        self._heartbeats.start()

    def stop_heartbeats(self) -> None:
        """Go silent to the router while still serving (a rank cut off from it)."""
        self._beating.clear()

    def kill(self) -> None:
        """Stop serving at once (streams break) and stop heartbeating."""
        self._stop.set()
        self._server.stop(0).wait(5)
        if self._heartbeats is not None:
            self._heartbeats.join(timeout=5)


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.01) -> None:
    """Poll until predicate() is true; fail the test after `timeout` seconds (generous: only a
    failing test waits it out, and a loaded machine must not turn a slow pass into a failure)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)
