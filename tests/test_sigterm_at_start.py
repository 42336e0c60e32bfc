"""A SIGTERM that comes as soon as a process says it serves ends it gracefully (exit 0).

Kubernetes sends SIGTERM whenever a pod goes (a roll, a scale-in, an eviction), also right after
it became ready. The engine used to install its handler only after the startup's last step (a
garbage-collector pass over the loaded model), so a SIGTERM in that window killed it: no drain,
exit -15 (seen in the packaging lane on a loaded machine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

COMMANDS = {
    "engine": ["engine", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0",
               "--metrics-port", "-1", "--device", "cpu", "--cpu-kv-gib", "0.25",
               "--drain-seconds", "1"],
    "router": ["router", "--host", "127.0.0.1", "--grpc-port", "0", "--rank-port", "0",
               "--metrics-port", "-1", "--insecure-rank-port", "--grace-seconds", "1"],
}  # fmt: skip
SERVING = {"engine": "grpc", "router": "router listening on port"}


@pytest.mark.slow  # a process per case, torch imported by the engine's
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_sigterm_right_after_the_ports_are_printed_exits_cleanly(command, tmp_path):
    args = [*COMMANDS[command], *(["--podinfo-dir", str(tmp_path)] if command == "engine" else [])]
    process = subprocess.Popen(
        [sys.executable, "-m", "kvfleet.services.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        seen = []
        for line in process.stdout:
            seen.append(line)
            if SERVING[command] in line:
                process.send_signal(signal.SIGTERM)  # at once: inside the startup's last steps
                break
        else:
            pytest.fail(f"{command} never said it serves: {''.join(seen)[-2000:]}")
        assert process.wait(timeout=60) == 0, "".join(seen)[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
