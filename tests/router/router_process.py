"""`kvfleet router` as a process of the test's own (SIGKILL-able), on a free port."""

from __future__ import annotations

import re
import subprocess
import sys


def start_router(redis_url: str, prefix: str, *extra: str) -> tuple[subprocess.Popen, int]:
    """Start a router process on Redis under `prefix`; returns it and its gRPC port."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvfleet.services.cli",
            "router",
            "--host",
            "127.0.0.1",
            "--grpc-port",
            "0",
            "--metrics-port",
            "-1",
            "--redis-url",
            redis_url,
            "--redis-prefix",
            prefix,
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = process.stdout.readline()
    match = re.search(r"port (\d+)", line)
    if match is None:
        process.kill()
        raise RuntimeError(f"router did not print its port: {line!r}")
    return process, int(match.group(1))
