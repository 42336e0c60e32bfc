"""A request's outputs as the submitting thread reads them (filled by the engine core)."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

from ..request.engine_request import GenerateCall, SampleOutput


class RequestCancelled(Exception):
    """Read from a handle after `cancel`: nothing more will come."""


_CANCELLED = RequestCancelled()


class RequestHandle:
    """Outputs of one request, read by the thread that submitted it."""

    def __init__(self, call: GenerateCall, cancel: Callable[[str], None]) -> None:
        self.call = call
        self._cancel = cancel
        # SimpleQueue: one C call per put, where the core puts a token of each request per step
        self._outputs: queue.SimpleQueue[SampleOutput | BaseException] = queue.SimpleQueue()
        self._unfinished = call.num_samples
        self._wake: Callable[[], None] | None = None

    @property
    def done(self) -> bool:
        return self._unfinished == 0

    def get(self, timeout: float) -> SampleOutput | None:
        """The next output, or None after `timeout` seconds; raises if the core stopped."""
        try:
            item = self._outputs.get(timeout=timeout)
        except queue.Empty:
            return None
        return self._took(item)

    def poll(self) -> SampleOutput | None:
        """The next output if one is queued, else None at once; raises if the core stopped."""
        try:
            item = self._outputs.get_nowait()
        except queue.Empty:
            return None
        return self._took(item)

    def wake_on_put(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the core thread) after each later `put`: how an event loop
        waits for outputs without parking a thread per request."""
        self._wake = callback

    def _took(self, item: SampleOutput | BaseException) -> SampleOutput:
        if item is _CANCELLED:
            self._unfinished = 0
            raise RequestCancelled(f"request {self.call.request_id} was cancelled")
        if isinstance(item, BaseException):
            self._unfinished = 0
            raise item
        self._unfinished -= item.finished
        return item

    def outputs(self, timeout: float = 600.0) -> Iterator[SampleOutput]:
        """Every output until all samples finish; TimeoutError if one takes over `timeout`."""
        while not self.done:
            item = self.get(timeout)
            if item is None:
                raise TimeoutError(f"request {self.call.request_id}: no output for {timeout} s")
            yield item

    def cancel(self) -> None:
        """Stop the request and free its pages (a client that went away); a reader blocked
        on this handle gets RequestCancelled at once (it would wait for outputs that never
        come, holding its thread)."""
        if not self.done:
            self._cancel(self.call.request_id)
            self.put(_CANCELLED)

    def put(self, item: SampleOutput | BaseException) -> None:
        """The engine side (core thread): queue an output, or the error that ends the request."""
        self._outputs.put(item)
        if self._wake is not None:
            self._wake()
