"""Run an ASGI app with uvicorn on a thread of its own (port 0 picks a free port)."""

from __future__ import annotations

import threading
import time

import uvicorn

from .http_read_timeout import READ_IDLE_SECONDS, read_timeout_protocol


class HttpServer:
    """A uvicorn server on a background thread; `port` is the bound port after `start`.
    `tls=(certificate chain, key)` PEM files serve HTTPS instead of HTTP. A connection whose
    request stops arriving for `read_idle_seconds` is closed."""

    def __init__(
        self,
        app,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: tuple[str, str] | None = None,
        read_idle_seconds: float = READ_IDLE_SECONDS,
    ) -> None:
        cert, key = tls or (None, None)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            ssl_certfile=cert,
            ssl_keyfile=key,
            # A request that stops arriving is closed (http_read_timeout.py).
            http=read_timeout_protocol(read_idle_seconds),
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="http", daemon=True)
        self.host = host
        self.port: int | None = None

    def start(self, timeout: float = 10.0) -> HttpServer:
        """Start serving; raises OSError if the port is not bound within `timeout` seconds."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():  # uvicorn exits its thread when it cannot bind
                raise OSError(f"HTTP server could not bind {self.host}:{self._server.config.port}")
            if time.monotonic() > deadline:
                raise OSError(f"HTTP server on {self.host} did not start within {timeout} s")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Ask uvicorn to exit and wait for its thread."""
        self._server.should_exit = True
        self._thread.join(timeout)
