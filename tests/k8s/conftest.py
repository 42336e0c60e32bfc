"""A real Kubernetes API server (the shared k8s kit: v1.20 apiserver, controller-manager, etcd;
no scheduler or kubelet) with the chart applied, and the operator running in this process as
the chart's service account, so the chart's RBAC is what it gets."""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from operator_replicas import forbidden_lines

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "operator"))  # chart_tools, operator_testkit (no packages)


K8S_KIT = Path(os.environ.get("KVFLEET_K8S_KIT", TESTS.parents[1] / "shared" / "k8s"))
if not (K8S_KIT / "start.sh").exists():  # a worktree sits one level deeper than the repo
    K8S_KIT = Path(os.environ.get("KVFLEET_K8S_KIT", TESTS.parents[2] / "shared" / "k8s"))
OPERATOR_NAMESPACE = "kvfleet-system"
RELEASE = "kv"
SERVICE_ACCOUNT = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{RELEASE}-kvfleet"
START_TIMEOUT_SECONDS = 300


def _read_env(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> dict[str, str]:
    """The kit's cluster for this module's tests (stopped after them, so the later suites run
    without it); its env file as a dict."""
    if not (K8S_KIT / "start.sh").exists():
        pytest.skip(f"no Kubernetes test kit at {K8S_KIT} (set KVFLEET_K8S_KIT)")
    state = tmp_path_factory.mktemp("k8s")
    started = subprocess.run(
        ["bash", str(K8S_KIT / "start.sh"), "--owner-pid", str(os.getpid()), str(state),
         SERVICE_ACCOUNT],
        capture_output=True, text=True, timeout=START_TIMEOUT_SECONDS,
    )  # fmt: skip
    if started.returncode != 0:
        pytest.fail(f"the k8s kit did not start:\n{started.stderr}")
    try:
        yield _read_env(state / "env")
    finally:
        subprocess.run(["bash", str(K8S_KIT / "stop.sh"), str(state)], timeout=120)


class ForbiddenLog(logging.Handler):
    """Collects every log line that reports a 403 (an RBAC rule the chart lacks)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += forbidden_lines([record.getMessage()])


@pytest.fixture(scope="module")
def chart(cluster) -> dict:
    """The chart rendered by `helm template` and created on the cluster (the admin's identity)."""
    from k8s_kit import admin_client, apply_chart

    client = admin_client(cluster)
    apply_chart(client, RELEASE, OPERATOR_NAMESPACE)
    return {"client": client, "release": RELEASE, "namespace": OPERATOR_NAMESPACE}


@pytest.fixture(scope="module")
def operator_identity(cluster, chart) -> Path:
    """The kubeconfig of the chart's service account."""
    state = Path(cluster["KVFLEET_K8S_DIR"])
    return state / f"sa-{OPERATOR_NAMESPACE}-{RELEASE}-kvfleet.kubeconfig"


@pytest.fixture
async def operator(operator_identity, monkeypatch):
    """The operator's handlers in kopf, in this event loop, as the chart's service account."""
    import kubernetes.config.kube_config
    from operator_testkit import start_operator, stop_operator

    monkeypatch.setenv("KUBECONFIG", str(operator_identity))
    monkeypatch.setattr(
        kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(operator_identity)
    )
    forbidden = ForbiddenLog()
    logging.getLogger().addHandler(forbidden)
    task, stop, settings = await start_operator(
        request_timeout=15, ready_timeout=30, server_timeout=10
    )
    try:
        yield forbidden
    finally:
        await stop_operator(task, stop, settings)
        logging.getLogger().removeHandler(forbidden)
