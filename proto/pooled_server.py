"""A gRPC server that owns its thread pool.

`grpc.Server.stop()` ends the server but never the `ThreadPoolExecutor` it was given: the
pool's threads stay alive (idle, holding what they last touched) until the process exits, and
a process that starts and stops servers, as tests and `kvfleet up` restarts do, piles them up.
A `PooledServer` shuts its pool down once the server has stopped.
"""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any

import grpc

from .limits import GRPC_MESSAGE_OPTIONS


class PooledServer:
    """A grpc.Server (every method is the server's) whose `stop` also ends its pool."""

    def __init__(self, max_workers: int, thread_name_prefix: str, **server_options: Any) -> None:
        self.pool = futures.ThreadPoolExecutor(max_workers, thread_name_prefix=thread_name_prefix)
        server_options.setdefault("options", GRPC_MESSAGE_OPTIONS)
        self._server = grpc.server(self.pool, **server_options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    def stop(self, grace: float | None) -> threading.Event:
        """grpc's stop (new calls refused, running ones cancelled after `grace` seconds), then
        the pool's threads are told to exit; returns grpc's event, already set."""
        stopped = self._server.stop(grace)
        stopped.wait((grace or 0) + 5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        return stopped
