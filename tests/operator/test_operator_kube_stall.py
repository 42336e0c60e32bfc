"""An API server that accepts a call and never answers costs the operator a bounded time: each
call times out and is retried once, so one stall cannot hold a fleet's tick for minutes."""

from __future__ import annotations

import socket
import threading
import time

import kubernetes
import pytest
import urllib3
from kvfleet.operator import kube
from kvfleet.operator.children import Resource


class SilentServer:
    """Accepts connections, reads what is sent, answers nothing; counts the requests."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests = 0
        self.connections: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.connections.append(connection)
            self.requests += 1

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (close alone won't)
        self.listener.close()
        for connection in self.connections:
            connection.close()
        self._thread.join(timeout=10)


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()


def test_a_stalled_call_is_given_up_after_one_retry(silent_server):
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{silent_server.port}"
    read_timeout = 0.5
    api = kube.KubeApi(configuration, request_timeout=(1.0, read_timeout))
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        api.get(Resource("apps", "v1", "statefulsets"), "ns1", "fleet")
    elapsed = time.monotonic() - started
    assert silent_server.requests == 2  # the call and its one retry, not urllib3's default 4
    assert elapsed < 10 * read_timeout  # bounded by the timeouts, not by the server


def test_the_shipped_timeouts_bound_one_call_well_inside_a_minute():
    connect, read = kube.REQUEST_TIMEOUT_SECONDS
    assert connect + (1 + kube.RETRIES.total) * read <= 30
