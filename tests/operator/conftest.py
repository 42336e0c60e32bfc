"""Fixtures that run the real operator against kmock's in-memory Kubernetes API on loopback."""

from __future__ import annotations

import pytest
import yaml
from operator_testkit import POOL_CRD_PATH, load_crd, start_operator, stop_operator


@pytest.fixture
def k8s(kmock):
    """kmock with the built-in resources and the KVFleet CRD (status subresource) declared."""
    import kmock as kmock_lib

    kmock.resources.load_bundled()
    for crd in (load_crd(), load_crd(POOL_CRD_PATH)):
        names, version = crd["spec"]["names"], crd["spec"]["versions"][0]
        key = f"{crd['spec']['group']}/{version['name']}/{names['plural']}"
        kmock.resources[key] = kmock_lib.ResourceInfo(
            kind=names["kind"],
            singular=names["singular"],
            namespaced=True,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            shortnames=set(names["shortNames"]),
            subresources=set(version["subresources"]),
        )
    return kmock


@pytest.fixture
def kubeconfig(k8s, tmp_path, monkeypatch):
    """A kubeconfig pointing at kmock, where both kopf and the operator's client look."""
    import kubernetes.config.kube_config

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": str(k8s.url).rstrip("/")}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
        "current-context": "kmock",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    # The client computed its default location at import time: point that at the file too.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    return path


@pytest.fixture
async def operator(kubeconfig, k8s):
    """The operator's handlers running in kopf, in this event loop, until the test ends."""
    task, stop, settings = await start_operator(request_timeout=10, ready_timeout=10)
    yield task
    await stop_operator(task, stop, settings)
