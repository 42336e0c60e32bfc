"""A redis-server of the test's own on a free port: stopped, restarted, paused or locked with a
password by the test (the shared one on 6379 is never touched that way)."""

from __future__ import annotations

import signal
import socket
import subprocess

import redis
from router_fake_engine import wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OwnRedis:
    """One redis-server process; `start` again after `stop` comes back empty (no persistence).
    With `tls=(cert, key)` it serves TLS only (no plain port) with that certificate."""

    def __init__(self, password: str | None = None, tls: tuple[str, str] | None = None) -> None:
        self.port = free_port()
        self.password = password
        self.tls = tls
        auth = f":{password}@" if password else ""
        scheme = "rediss" if tls else "redis"
        self.url = f"{scheme}://{auth}127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        args = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.tls:
            cert, key = self.tls
            args += ["--port", "0", "--tls-port", str(self.port)]
            args += ["--tls-cert-file", cert, "--tls-key-file", key, "--tls-auth-clients", "no"]
        else:
            args += ["--port", str(self.port)]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            ["redis-server", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = self.client(socket_timeout=1)
        wait_until(lambda: _pings(client))
        client.close()

    def client(self, **kwargs) -> redis.Redis:
        if self.tls:
            kwargs = {"ssl": True, "ssl_ca_certs": self.tls[0], **kwargs}
        return redis.Redis(port=self.port, password=self.password, decode_responses=True, **kwargs)

    def stop(self) -> None:
        if self.process is not None:
            self.resume()
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing answers (a hung Redis)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
