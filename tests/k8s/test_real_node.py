"""The chart and a CPU fleet on a real one-node Kubernetes 1.20 cluster (tests/k8s/node/: the
API-server kit plus kubelet, scheduler, kube-proxy, containerd, bridge CNI and a DNS stand-in,
inside a network namespace), with images built by docker/build-images.sh: helm install, a fleet
on a tiny random Qwen3 checkpoint Ready, OpenAI and Anthropic requests through the router's
Service, prefix reuse on a second turn, a pool scaled in (drained through the kubelet), helm
upgrade to a new image tag (the fleet rolls), helm uninstall, then the fleet and its namespace
deleted without an operator. The `cluster` lane (tests/lanes.sh) runs it, as root only."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chart_tools import layer_binary
from node_kit import (
    K8S_KIT,
    NODE_DIR,
    REPO,
    Journal,
    Node,
    node_lock,
    read_env,
    run_logged,
    wait_until,
)

# the whole run (images, node, fleet) on a cold cache and a loaded machine, not the suite's 300 s
pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(3000)]

RELEASE, OPERATOR_NAMESPACE, FLEET_NAMESPACE, FLEET = "kv", "kvfleet-system", "kvfleet", "coder"
TAG, NEW_TAG = "0.1.0", "0.1.0-rolled"
# Only a failure waits this long; the first fleet start on a loaded 2-core machine (three
# engine/router pods importing torch at once) takes minutes.
READY_SECONDS = 900
IMAGES_SECONDS = 3600
SERVED_MODEL = "tiny-qwen3"
DISK_TIER = {"storageClassName": "manual", "size": "1Gi", "accessMode": "ReadWriteMany"}


@pytest.fixture(scope="module")
def journal() -> Journal:
    journal = Journal()
    yield journal
    journal.note(journal.summary())


@pytest.fixture(scope="module")
def node(tmp_path_factory, journal) -> Node:
    """Images built (cached), then a fresh node; stopped (and everything undone) afterwards."""
    if os.geteuid() != 0:
        pytest.skip("the one-node cluster needs root (network namespace, containerd, kubelet)")
    if platform.machine() != "x86_64" or not Path("/proc/self/ns/net").exists():
        pytest.skip("the node's binaries are linux/amd64")
    if not (K8S_KIT / "node" / "bin" / "kubelet.xz").exists():
        pytest.skip(f"no node binaries in the Kubernetes kit at {K8S_KIT} (set KVFLEET_K8S_KIT)")
    state = tmp_path_factory.mktemp("node")
    # copies of our own: the shared unpacked ones in /tmp may be cleaned away during a long run
    (state / "bin").mkdir()
    kubectl, helm = (
        Path(shutil.copy2(layer_binary(name), state / "bin" / name)) for name in ("kubectl", "helm")
    )
    environment = {**os.environ, "KUBECTL": str(kubectl), "KVFLEET_K8S_KIT": str(K8S_KIT)}
    with node_lock():
        with journal.phase("images: docker/build-images.sh"):
            run_logged(["bash", "docker/build-images.sh"], state / "images.log", IMAGES_SECONDS)
        sizes = [line for line in (state / "images.log").read_text().splitlines()
                 if line.startswith(("ghcr.io/", "docker.io/", "registry.k8s.io/"))]  # fmt: skip
        journal.note("image sizes:\n  " + "\n  ".join(sizes))
        try:
            with journal.phase("node: start-node.sh"):
                run_logged(
                    ["bash", str(NODE_DIR / "start-node.sh"), "--owner-pid", str(os.getpid()),
                     str(state / "node")],
                    state / "node-start.log", 900, environment,
                )  # fmt: skip
            yield Node(read_env(state / "node" / "env"), kubectl, helm)
        finally:
            with journal.phase("node: stop-node.sh"):
                subprocess.run(["bash", str(NODE_DIR / "stop-node.sh"), str(state / "node")],
                               timeout=300, env=environment)  # fmt: skip


def _storage(node: Node) -> list[dict]:
    """The model's PV/PVC (hostPath, read-only) and a hostPath PV for the fleet's disk tier."""
    models, disk = node.env["KVFLEET_NODE_MODELS"], node.env["KVFLEET_NODE_DISK"]
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "model-weights-pv"},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
                  "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                  "claimRef": {"namespace": FLEET_NAMESPACE, "name": "model-weights"},
                  "hostPath": {"path": models, "type": "Directory"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": "model-weights", "namespace": FLEET_NAMESPACE},
         "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "",
                  "volumeName": "model-weights-pv", "resources": {"requests": {"storage": "1Gi"}}}},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "kv-disk-pv"},
         "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteMany"],
                  "storageClassName": "manual", "persistentVolumeReclaimPolicy": "Retain",
                  "hostPath": {"path": disk, "type": "Directory"}}},
    ]  # fmt: skip


def _fleet(generation_replicas: int) -> dict:
    """A CPU fleet: one context and `generation_replicas` generation ranks, a managed Redis."""
    return {
        "apiVersion": "kvfleet.dev/v1alpha1",
        "kind": "KVFleet",
        "metadata": {"name": FLEET, "namespace": FLEET_NAMESPACE},
        "spec": {
            "model": {"name": SERVED_MODEL, "path": "qwen3", "pvcName": "model-weights"},
            "pools": {
                "context": {"replicas": 1, "gpusPerPod": 0, "maxBatchSize": 4},
                "generation": {"replicas": generation_replicas, "gpusPerPod": 0, "maxBatchSize": 4},
            },
            "kvTiers": {"hostGiB": 1, "disk": DISK_TIER},
            "redis": {"mode": "managed"},
            "drainSeconds": 20,
        },
    }


def _fleet_ready(node: Node) -> bool:
    fleet = node.get("kvfleet", FLEET, "-n", FLEET_NAMESPACE)
    conditions = (fleet.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _pods(node: Node, component: str) -> list[dict]:
    selector = f"kvfleet.dev/fleet={FLEET},kvfleet.dev/component={component}"
    return node.get("pods", "-n", FLEET_NAMESPACE, "-l", selector)["items"]


def _project_pods(node: Node) -> list[dict]:
    """The fleet's router and engine pods (not its Redis)."""
    pods = node.get("pods", "-n", FLEET_NAMESPACE, "-l", f"kvfleet.dev/fleet={FLEET}")["items"]
    return [pod for pod in pods if "ghcr.io/kvfleet/" in _images_of(pod)]


def _images_of(pod: dict) -> str:
    return " ".join(container["image"] for container in pod["spec"]["containers"])


def _pod_ready(pod: dict) -> bool:
    conditions = pod["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _all_ready(node: Node, image_tag: str) -> bool:
    """Every router/engine pod runs `image_tag` and is Ready, and the fleet says Ready."""
    pods = _project_pods(node)
    if not pods or any(pod["metadata"].get("deletionTimestamp") for pod in pods):
        return False
    tags = {image.rpartition(":")[2] for pod in pods for image in _images_of(pod).split()}
    return tags == {image_tag} and all(map(_pod_ready, pods)) and _fleet_ready(node)


def _scale_generation(node: Node, replicas: int) -> None:
    patch = {"spec": {"pools": {"generation": {"replicas": replicas}}}}
    node.kubectl("-n", FLEET_NAMESPACE, "patch", "kvfleet", FLEET, "--type=merge",
                 "-p", json.dumps(patch))  # fmt: skip


def _generation_pods(node: Node) -> set[str]:
    return {pod["metadata"]["name"] for pod in _pods(node, "engine-generation")}


# A first turn long enough to fill whole KV pages, so the second turn can reuse them.
FIRST_TURN = "Review this function and list its bugs: " + " ".join(
    f"line{i} = compute(value{i}, offset={i})" for i in range(40)
)


def test_chart_and_cpu_fleet_on_a_real_node(node: Node, journal: Journal):
    with journal.phase("model: a tiny random Qwen3 checkpoint on the node's hostPath"):
        kvfleet = Path(sys.executable).parent / "kvfleet"
        subprocess.run(
            [str(kvfleet), "model-dir", "--arch", "Qwen3ForCausalLM",
             str(Path(node.env["KVFLEET_NODE_MODELS"]) / "qwen3")],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        for path in Path(node.env["KVFLEET_NODE_MODELS"]).rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)  # shards are written 0600
        os.chmod(node.env["KVFLEET_NODE_DISK"], 0o777)  # the engine runs as 10001

    with journal.phase("helm install (operator Available)"):
        journal.note(node.helm("install", RELEASE, str(REPO / "charts" / "kvfleet"),
                               "-n", OPERATOR_NAMESPACE, "--create-namespace",
                               "--set", f"image.tag={TAG}").splitlines()[0])  # fmt: skip
        node.kubectl("-n", OPERATOR_NAMESPACE, "wait", "--for=condition=Available",
                     f"deployment/{RELEASE}-kvfleet", "--timeout=600s", timeout=620)  # fmt: skip

    with journal.phase("fleet applied -> Ready (1 context, 1 generation rank)"):
        node.kubectl("create", "namespace", FLEET_NAMESPACE)
        node.apply(_storage(node))
        node.apply([_fleet(generation_replicas=1)])
        wait_until(lambda: _all_ready(node, TAG), "the fleet Ready", READY_SECONDS)

    router = node.get("service", f"{FLEET}-router", "-n", FLEET_NAMESPACE)
    base = f"http://{router['spec']['clusterIP']}:8000"
    journal.note(f"router Service {FLEET}-router at {base}")

    with journal.phase("requests: OpenAI chat, second turn, Anthropic messages"):
        first = [{"role": "user", "content": FIRST_TURN}]
        reply = node.post(
            f"{base}/v1/chat/completions",
            {"model": SERVED_MODEL, "messages": first, "max_tokens": 8},
            journal,
        )
        assert reply["choices"][0]["message"]["role"] == "assistant"
        answer = reply["choices"][0]["message"]["content"]
        second = [*first, {"role": "assistant", "content": answer},
                  {"role": "user", "content": "And the fix for line3?"}]  # fmt: skip
        reply = node.post(
            f"{base}/v1/chat/completions",
            {"model": SERVED_MODEL, "messages": second, "max_tokens": 8},
            journal,
        )
        cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0, f"the second turn reused nothing: {reply['usage']}"
        hello = [{"role": "user", "content": "Say hi."}]
        reply = node.post(
            f"{base}/v1/messages",
            {"model": SERVED_MODEL, "max_tokens": 8, "messages": hello},
            journal,
        )
        assert reply["type"] == "message" and reply["content"], reply

    # Each engine pod asks for its host tier + 8 GiB (the operator's floor): a 24 GiB node holds
    # two, so the pool scales in from 1 to 0 (drained by the kubelet) and back.
    with journal.phase("scale in: generation 1 -> 0 (drained, pod gone), then back to 1"):
        before = _generation_pods(node)
        assert len(before) == 1, before
        _scale_generation(node, 0)
        wait_until(lambda: not _generation_pods(node), "no generation pod", READY_SECONDS)
        journal.note(f"generation pods {sorted(before)} -> none")
        _scale_generation(node, 1)
        wait_until(lambda: _all_ready(node, TAG), "the fleet Ready again", READY_SECONDS)
        node.post(
            f"{base}/v1/chat/completions",
            {"model": SERVED_MODEL, "messages": second, "max_tokens": 8},
            journal,
        )

    with journal.phase(f"helm upgrade --set image.tag={NEW_TAG} (operator and fleet roll)"):
        ctr = ["ctr", "-a", str(Path(node.env["KVFLEET_NODE_DIR"]) / "containerd/containerd.sock"),
               "-n", "k8s.io"]  # fmt: skip
        for name in ("operator", "router", "engine"):
            node.in_netns(*ctr, "images", "tag", "--force", f"ghcr.io/kvfleet/{name}:{TAG}",
                          f"ghcr.io/kvfleet/{name}:{NEW_TAG}")  # fmt: skip
        # The router asks for 1 CPU and its rolling update adds a second router before removing
        # the first: a 2-CPU node cannot hold both, so here it replaces instead.
        no_surge = {"spec": {"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}}
        node.kubectl("-n", FLEET_NAMESPACE, "patch", "deployment", f"{FLEET}-router",
                     "-p", json.dumps(no_surge))  # fmt: skip
        node.helm("upgrade", RELEASE, str(REPO / "charts" / "kvfleet"), "-n", OPERATOR_NAMESPACE,
                  "--set", f"image.tag={NEW_TAG}")  # fmt: skip
        wait_until(lambda: _all_ready(node, NEW_TAG), "the fleet rolled", READY_SECONDS)
        journal.note(f"fleet images now: {sorted(map(_images_of, _project_pods(node)))}")
        node.post(
            f"{base}/v1/chat/completions",
            {"model": SERVED_MODEL, "messages": first, "max_tokens": 8},
            journal,
        )

    with journal.phase("helm uninstall (the pre-delete hook releases the fleet)"):
        node.helm("uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--timeout", "300s", timeout=360)
        fleet = node.get("kvfleet", FLEET, "-n", FLEET_NAMESPACE)
        assert "kvfleet.dev/cleanup" not in (fleet["metadata"].get("finalizers") or []), fleet

    with journal.phase("fleet and its namespace deleted without an operator"):
        node.kubectl("-n", FLEET_NAMESPACE, "delete", "kvfleet", FLEET, "--timeout=180s",
                     timeout=200)  # fmt: skip
        node.kubectl("delete", "namespace", FLEET_NAMESPACE, "--timeout=300s", timeout=320)
        gone = node.kubectl("get", "namespace", FLEET_NAMESPACE, check=False)
        assert gone == "", gone
