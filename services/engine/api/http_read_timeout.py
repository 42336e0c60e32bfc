"""uvicorn's HTTP/1.1 protocol with a read timeout: a request that stops arriving is closed.

uvicorn closes an idle keep-alive connection (`timeout_keep_alive`), but has no timeout while
a request is being read: a client that opens a connection, or sends half a request head or
body, and then goes quiet holds the connection (and a file descriptor) for good; enough of them
(slowloris) exhaust the server. This protocol closes a connection that has sent nothing for
`idle_seconds` while its request is incomplete (from the connection's start, or within the head
or the body). A request fully read is never timed here: the reply may take as long as it takes.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

READ_IDLE_SECONDS = 30.0  # a client on a slow link still sends some bytes within this


def read_timeout_protocol(idle_seconds: float = READ_IDLE_SECONDS) -> type[H11Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`, closing after `idle_seconds`."""

    class ReadTimeoutH11Protocol(H11Protocol):
        _read_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_read_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._arm_read_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_read_timer()
            super().connection_lost(exc)

        def _arm_read_timer(self) -> None:
            """(Re)start the idle clock while the request is incomplete; stop it otherwise."""
            self._cancel_read_timer()
            reading = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
            if reading and not self.transport.is_closing():
                self._read_timer = self.loop.call_later(idle_seconds, self._read_timed_out)

        def _cancel_read_timer(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _read_timed_out(self) -> None:
            self._read_timer = None
            stalled = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
            if stalled and not self.transport.is_closing():
                self.transport.close()

    return ReadTimeoutH11Protocol
