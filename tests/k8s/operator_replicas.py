"""Operator replicas as real processes (`kvfleet operator --peering`) on the kit's API server, for
the leader-election tests: start and stop them, read what they logged and the keep-alive
records they keep in the peering object."""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import kubernetes

STOP_SECONDS = 30.0
# kopf's log lines start with their local time: "[2026-12-06 01:50:46,616] kopf.objects ..."
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] (.*)$")
# What a replica logs when it runs a handler (kopf: "Handler 'x' succeeded.", "Timer 'tick' ...").
_HANDLER = re.compile(r"\b(Handler|Timer) '")
RESUMED = "Resuming operations"  # kopf: this replica now runs the handlers
PAUSED = "Pausing operations"  # kopf: a peer of higher priority is alive
STARTED = "Initial authentication has finished"  # kopf is past its start-up activities
# An API refusal: "Forbidden" (kopf's APIForbiddenError, the client's "Reason: Forbidden") or a
# 403 standing alone; not digits of a longer number, such as the pid in a peer id
# ("Announced to peers as 'vm/13403/bb5b4d'").
_FORBIDDEN = re.compile(r"orbidden|(?<![\w/])403(?![\w/])")


@dataclass
class Replica:
    """One `kvfleet operator` process and its log file."""

    name: str
    priority: int
    process: subprocess.Popen
    log: Path

    def lines(self) -> list[tuple[datetime.datetime, str]]:
        """(time, message) of every line it logged so far."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            match = _STAMP.match(line)
            if match:
                stamp = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f")
                found.append((stamp, match[2]))
        return found

    def handler_runs(self) -> list[tuple[datetime.datetime, str]]:
        """Every handler it ran (each is a write, or may be one)."""
        return [(at, text) for at, text in self.lines() if _HANDLER.search(text)]

    def first(self, text: str) -> datetime.datetime | None:
        """When it first logged a line with `text`."""
        return next((at for at, line in self.lines() if text in line), None)

    def forbidden(self) -> list[str]:
        """The lines where the API server refused it something."""
        return forbidden_lines(text for _, text in self.lines())


def forbidden_lines(lines: Iterable[str]) -> list[str]:
    """The lines that tell of an API refusal (403 / Forbidden)."""
    return [text for text in lines if _FORBIDDEN.search(text)]


class Replicas:
    """Starts replicas that share one peering object; `stop()` ends every one still running."""

    def __init__(self, kubeconfig: Path, peering: str, logs: Path) -> None:
        self._kubeconfig, self._peering, self._logs = kubeconfig, peering, logs
        self.started: list[Replica] = []

    def start(self, name: str, priority: int) -> Replica:
        log = self._logs / f"{name}.log"
        command = [
            sys.executable, "-c", "import sys; from kvfleet.services.cli import main; "
            "sys.exit(main())", "operator", f"--peering={self._peering}",
            f"--priority={priority}", "--liveness-port=0",
        ]  # fmt: skip
        env = {**os.environ, "KUBECONFIG": str(self._kubeconfig), "PYTHONUNBUFFERED": "1"}
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        replica = Replica(name, priority, process, log)
        self.started.append(replica)
        return replica

    def stop(self) -> None:
        for replica in self.started:
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)
        for replica in self.started:
            try:
                replica.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                replica.process.kill()
                replica.process.wait()


def keepalives(client: kubernetes.client.ApiClient, peering: str) -> dict[int, str]:
    """priority -> `lastseen` of each keep-alive record in the cluster-wide peering object."""
    custom = kubernetes.client.CustomObjectsApi(client)
    body = custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", peering)
    records = (body.get("status") or {}).values()
    return {record["priority"]: record["lastseen"] for record in records if record}
