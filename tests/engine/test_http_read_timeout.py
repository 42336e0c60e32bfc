"""The HTTP server closes a connection whose request stops arriving (slowloris), and leaves
a slow reply alone."""

from __future__ import annotations

import asyncio
import socket

import pytest
from fastapi import FastAPI
from kvfleet.services.engine.api.http_server import HttpServer

IDLE_S = 0.5
CLOSED_WITHIN_S = 30.0  # a bound only a broken build reaches


@pytest.fixture
def server():
    app = FastAPI()

    @app.post("/echo")
    async def echo(body: dict) -> dict:
        return body

    @app.get("/slow")
    async def slow() -> dict:
        await asyncio.sleep(4 * IDLE_S)  # longer than the read timeout: the reply is not timed
        return {"ok": True}

    http = HttpServer(app, read_idle_seconds=IDLE_S).start()
    yield http
    http.stop()


def _closed_by_server(sock: socket.socket) -> bool:
    """True when the server closes the connection (EOF) before the bound."""
    sock.settimeout(CLOSED_WITHIN_S)
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # connected, then silent
        b"POST /echo HTTP/1.1\r\nHost: x\r\n",  # half a head
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",  # half a body
    ],
    ids=["nothing", "half-head", "half-body"],
)
def test_a_stalled_request_is_closed(server, sent):
    """Without a read timeout each such connection is held for good: a few thousand of them
    and the rank accepts no more."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(sent)
        assert _closed_by_server(sock)


def test_a_reply_slower_than_the_read_timeout_is_served(server):
    """The timeout is on reading the request, never on the model taking its time."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(CLOSED_WITHIN_S)
        reply = b""
        while b'{"ok":true}' not in reply:  # head and body may come in separate writes
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and b'{"ok":true}' in reply
