"""A command started as a process, read until it prints the line saying it listens."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import threading
import urllib.request
from pathlib import Path


class ListeningProcess:
    """Starts `command`, keeps its stdout lines, sends its stderr to `log`."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._lines: queue.Queue[str | None] = queue.Queue()
        with log.open("w") as stderr:
            self.process = subprocess.Popen(
                command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        # A reader thread: a blocking readline could otherwise outlive any timeout.
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        """The first stdout line matching `pattern`; fails on exit or after `timeout` s."""
        try:
            while (line := self._lines.get(timeout=timeout)) is not None:
                if match := re.search(pattern, line):
                    return match
        except queue.Empty:
            pass
        raise AssertionError(f"no line matching {pattern!r}; stderr:\n{self.stderr_tail()}")

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (what Kubernetes sends) and its exit status."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stderr_tail(self) -> str:
        return self.log.read_text()[-3000:]


def http_json(url: str, body: dict | None = None) -> dict:
    """GET (or POST `body` to) `url` on a local port; the JSON reply, which must be a 200."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no $http_proxy
    with direct.open(request, timeout=120) as reply:
        assert reply.status == 200, reply.status
        return json.loads(reply.read())
