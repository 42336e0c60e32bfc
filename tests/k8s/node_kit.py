"""Helpers of the one-node cluster suite: build the images, start and stop the node
(tests/k8s/node/), run kubectl/helm and HTTP requests inside the node's network namespace, and
a log of every phase's time and every request and reply."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# the shared API-server kit, next to the repository or one level up from a worktree
K8S_KIT = Path(os.environ.get("KVFLEET_K8S_KIT", REPO.parent / "shared" / "k8s"))
if not (K8S_KIT / "start.sh").exists():
    K8S_KIT = Path(os.environ.get("KVFLEET_K8S_KIT", REPO.parents[1] / "shared" / "k8s"))
NODE_DIR = Path(__file__).resolve().parent / "node"
LOCK_FILE = Path("/run/lock/kvfleet-node.lock")
# A second run on the machine (another CI job) waits its turn for the one node.
LOCK_WAIT_SECONDS = 1800


class Journal:
    """Phase times and the requests and replies, printed as they happen (the lane runs with -s)
    and kept for the summary at the end."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, float]] = []

    def note(self, text: str) -> None:
        print(f"[cluster] {text}", flush=True)

    @contextmanager
    def phase(self, name: str):
        started = time.monotonic()
        self.note(f"{name} ...")
        yield
        seconds = time.monotonic() - started
        self.phases.append((name, seconds))
        self.note(f"{name}: {seconds:.1f} s")

    def summary(self) -> str:
        total = sum(seconds for _, seconds in self.phases)
        lines = [f"  {name:<48} {seconds:7.1f} s" for name, seconds in self.phases]
        return "\n".join(["phases:", *lines, f"  {'total':<48} {total:7.1f} s"])


@contextmanager
def node_lock():
    """Hold the machine's node lock (one node per machine: a fixed namespace and node IP)."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "w") as handle:
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another run held {LOCK_FILE} for {LOCK_WAIT_SECONDS} s")
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_logged(command: list[str], log: Path, timeout: float, env: dict | None = None) -> None:
    """Run a script with its output in `log`; fail the test with the log's tail."""
    with open(log, "w") as out:
        result = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, env=env, cwd=REPO
        )
    if result.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n{tail}")


def read_env(path: Path) -> dict[str, str]:
    import shlex

    env = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


class Node:
    """The running node: commands in its network namespace as the cluster's admin."""

    def __init__(self, env: dict[str, str], kubectl: Path, helm: Path) -> None:
        self.env = env
        self.kubectl_path, self.helm_path = kubectl, helm
        self.netns = env["KVFLEET_NODE_NETNS"]

    def in_netns(self, *command: str, timeout: float = 120, check: bool = True) -> str:
        environment = {**os.environ, "KUBECONFIG": self.env["KUBECONFIG"]}
        result = subprocess.run(
            ["nsenter", f"--net=/var/run/netns/{self.netns}", *command],
            capture_output=True, text=True, timeout=timeout, env=environment,
        )  # fmt: skip
        if check and result.returncode != 0:
            pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n"
                        f"{result.stdout}\n{result.stderr}")  # fmt: skip
        return result.stdout

    def kubectl(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        return self.in_netns(str(self.kubectl_path), *args, timeout=timeout, check=check)

    def helm(self, *args: str, timeout: float = 300) -> str:
        return self.in_netns(str(self.helm_path), *args, timeout=timeout)

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, objects: list[dict]) -> None:
        manifest = yaml.safe_dump_all(objects)
        environment = {**os.environ, "KUBECONFIG": self.env["KUBECONFIG"]}
        result = subprocess.run(
            ["nsenter", f"--net=/var/run/netns/{self.netns}", str(self.kubectl_path), "apply",
             "-f", "-"],
            input=manifest, capture_output=True, text=True, timeout=120, env=environment,
        )  # fmt: skip
        if result.returncode != 0:
            pytest.fail(f"kubectl apply failed:\n{result.stderr}\n{manifest}")

    def post(self, url: str, body: dict, journal: Journal, timeout: float = 180) -> dict:
        """POST JSON from inside the node's namespace (where ClusterIPs route); log both ways."""
        journal.note(f"-> POST {url} {json.dumps(body)}")
        reply = self.in_netns(sys.executable, "-c", _POST, url, json.dumps(body), str(timeout),
                              timeout=timeout + 30)  # fmt: skip
        status, _, text = reply.partition("\n")
        journal.note(f"<- {status} {text.strip()}")
        assert status == "200", f"{url} answered {status}: {text}"
        return json.loads(text)


_POST = """
import sys, urllib.error, urllib.request
url, body, timeout = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(request, timeout=timeout) as reply:
        print(reply.status); print(reply.read().decode())
except urllib.error.HTTPError as error:
    print(error.code); print(error.read().decode())
"""


def wait_until(check: Callable[[], Any], what: str, timeout: float) -> Any:
    """Poll `check` every second until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")
