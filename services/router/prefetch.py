"""Router-driven prefetch: ask a conversation's home rank to bring its blocks up before its turn.

Two moments, both sent as `Engine.PrefetchConversation` to the home rank:

| moment                               | when sent                           | hold for         |
|--------------------------------------|-------------------------------------|------------------|
| a turn ended on its rank             | after `TurnGaps.window` (its own    | the window's end |
|                                      | gaps; never before one gap is seen) |                  |
| a pinned turn waits for a home slot  | at once, with the waiting prompt    | the wait bound   |

Sends are fire-and-forget on one worker thread: a rank that cannot (an older engine answers
UNIMPLEMENTED, a gone one UNAVAILABLE) only loses the head start, never a request.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Iterable

import grpc

from ...proto import common_pb2, engine_pb2, engine_pb2_grpc
from .model import PendingRequest
from .turn_gaps import TurnGaps

log = logging.getLogger(__name__)

SEND_TIMEOUT_SECONDS = 2.0  # a prefetch that takes longer has lost its point
MAX_ASKED = 100_000  # waiting request ids remembered as asked (bounded memory)

StubOf = Callable[[str], engine_pb2_grpc.EngineStub]


class PrefetchPlanner:
    """Gap models, due sends and the worker that makes them; one lock guards all three."""

    def __init__(self, stub_of: StubOf, clock: Callable[[], float], wait_bound_s: float) -> None:
        self._stub_of = stub_of
        self._clock = clock
        self._wait_bound_s = wait_bound_s
        self.gaps = TurnGaps()
        self.sent = 0
        self.failed = 0
        self._due: list[tuple[float, int, str, engine_pb2.PrefetchRequest]] = []
        self._order = itertools.count()
        self._asked: set[str] = set()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    # -- what the router calls -------------------------------------------------------------------

    def turn_arrived(self, conversation_id: str) -> None:
        """A turn reached the router: the gap since the conversation's last turn is learned."""
        if conversation_id:
            with self._cond:
                self.gaps.turn_arrived(conversation_id, self._clock())

    def turn_ended(self, conversation_id: str, address: str) -> None:
        """A turn finished on the rank at `address`: schedule its prefetch by its own gaps."""
        if not conversation_id:
            return
        with self._cond:
            now = self._clock()
            self.gaps.turn_ended(conversation_id, now)
            window = self.gaps.window(conversation_id)
            if window is None:
                return
            hold = max(window.hold_for_s - window.start_after_s, SEND_TIMEOUT_SECONDS)
            request = engine_pb2.PrefetchRequest(conversation_id=conversation_id, hold_seconds=hold)
            self._schedule(now + window.start_after_s, address, request)

    def waiting(self, requests: Iterable[PendingRequest], homes: dict[str, str]) -> None:
        """After a pass: turns still waiting whose home is `homes[conversation]` (an address)
        get that home onboarding their prompt now, once per request."""
        with self._cond:
            for request in requests:
                address = homes.get(request.conversation_id)
                if address is None or request.request_id in self._asked:
                    continue
                if len(self._asked) >= MAX_ASKED:
                    self._asked.clear()
                self._asked.add(request.request_id)
                prompt = common_pb2.TokenIds(ids=request.prompt_tokens)
                message = engine_pb2.PrefetchRequest(
                    conversation_id=request.conversation_id,
                    hold_seconds=max(self._wait_bound_s, SEND_TIMEOUT_SECONDS),
                    prompt_token_ids=prompt,
                )
                self._schedule(self._clock(), address, message)

    def after_pass(self, waiting: list[PendingRequest], store, ranks: dict, now: float) -> None:
        """The admission thread's hook: look up the homes of waiting turns not asked yet (one
        pin lookup for them all) and ask those homes to onboard them."""
        with self._cond:
            fresh = [r for r in waiting if r.conversation_id and r.request_id not in self._asked]
        if not fresh:
            return
        pins = store.get_pins({r.conversation_id for r in fresh}, now)
        homes = {c: ranks[rank].info.address for c, rank in pins.items() if rank in ranks}
        self.waiting(fresh, homes)

    # -- sending ---------------------------------------------------------------------------------

    def run_due(self) -> int:
        """Send every prefetch that is due now; returns how many were sent."""
        sent = 0
        while True:
            with self._cond:
                if not self._due or self._due[0][0] > self._clock():
                    return sent
                _, _, address, request = heapq.heappop(self._due)
            self._send(address, request)
            sent += 1

    def start(self) -> PrefetchPlanner:
        self._thread = threading.Thread(target=self._loop, name="router-prefetch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=SEND_TIMEOUT_SECONDS + 1)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                wait = self._due[0][0] - self._clock() if self._due else None
                if wait is None or wait > 0:
                    self._cond.wait(timeout=wait)
                    continue
            self.run_due()

    def _schedule(self, when: float, address: str, request: engine_pb2.PrefetchRequest) -> None:
        heapq.heappush(self._due, (when, next(self._order), address, request))
        self._cond.notify_all()

    def _send(self, address: str, request: engine_pb2.PrefetchRequest) -> None:
        try:
            self._stub_of(address).PrefetchConversation(request, timeout=SEND_TIMEOUT_SECONDS)
            self.sent += 1
        except grpc.RpcError as error:
            # NOTE: an engine without the call, or one that is going away: the turn is served
            # as before, only without the head start.
            self.failed += 1
            log.debug("prefetch of %s on %s: %s", request.conversation_id, address, error.code())
