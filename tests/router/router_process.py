"""`kvfleet router` as a process of the test's own (SIGKILL-able), on a free port."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

from kvfleet.services.router.fleet_secret import SECRET_ENV

TEST_FLEET_SECRET = "test-fleet-secret"


@dataclass
class RouterProcess:
    process: subprocess.Popen
    port: int  # the client gRPC port
    rank_port: int  # RankRegistry, asking for TEST_FLEET_SECRET


def start_router(redis_url: str, prefix: str, *extra: str) -> RouterProcess:
    """Start a router process on Redis under `prefix`, its rank port asking for the test's
    fleet secret."""
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
            "--rank-port",
            "0",
            "--http-port",
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
        env={**os.environ, SECRET_ENV: TEST_FLEET_SECRET},
    )
    line = process.stdout.readline()
    match = re.search(r"on port (\d+) rank port (\d+)", line)
    if match is None:
        process.kill()
        raise RuntimeError(f"router did not print its ports: {line!r}")
    return RouterProcess(process, int(match.group(1)), int(match.group(2)))
