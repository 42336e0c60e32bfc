"""Who may reach the engines, read off the NetworkPolicies the operator renders for the chart's
example fleet (no CNI here: the rules are evaluated the way the API documents them)."""

from __future__ import annotations

import pytest
import yaml
from kvfleet.operator.children import render_children
from kvfleet.operator.names import FleetRef
from kvfleet.operator.spec import parse_spec
from operator_testkit import EXAMPLE_FLEET

FLEET = FleetRef("coder", "kvfleet", "uid")


def _children() -> list[dict]:
    spec = parse_spec(yaml.safe_load(EXAMPLE_FLEET.read_text())["spec"])
    return render_children(FLEET, spec, {"context": 1, "generation": 2})


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    """A LabelSelector's verdict (matchLabels and `In` expressions, all the operator writes)."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _admits(policies: list[dict], target: dict, source: dict, port: int) -> bool:
    """Whether a pod labelled `source` (same namespace) may open `port` on a pod labelled
    `target`: an isolated pod takes only what some rule of a policy selecting it allows."""
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], target)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = [entry["port"] for entry in rule.get("ports", [])]
            peers = rule.get("from")
            port_ok = not ports or port in ports
            peer_ok = peers is None or any(_selects(p["podSelector"], source) for p in peers)
            if port_ok and peer_ok:
                return True
    return False


def _pod_labels(children: list[dict], component: str) -> dict[str, str]:
    for child in children:
        if (
            child["kind"] in {"StatefulSet", "Deployment"}
            and child["metadata"]["labels"].get("kvfleet.dev/component") == component
        ):
            return child["spec"]["template"]["metadata"]["labels"]
    raise AssertionError(f"no {component} workload rendered")


def _container_port(children: list[dict], component: str, name: str) -> int:
    for child in children:
        if child["kind"] != "StatefulSet":
            continue
        if child["metadata"]["labels"].get("kvfleet.dev/component") != component:
            continue
        for port in child["spec"]["template"]["spec"]["containers"][0]["ports"]:
            if port["name"] == name:
                return port["containerPort"]
    raise AssertionError(f"{component} has no port {name}")


@pytest.mark.parametrize(
    ("source", "port_name", "allowed"),
    [
        ("router", "http", True),  # the router's own way in (and /health for the kubelet)
        ("client", "http", False),  # a direct /v1/completions would bypass reservations
        ("engine-context", "http", False),  # no engine needs another's OpenAI API
        ("router", "grpc", True),
        ("engine-context", "grpc", True),  # the KV hand-off between pools
        ("client", "grpc", False),
        ("client", "metrics", True),  # scrapers and the operator's autoscaler
    ],
)
def test_engine_ports_admit_only_their_callers(source, port_name, allowed):
    """A client pod in the fleet's namespace must not reach an engine's HTTP or gRPC port."""
    children = _children()
    policies = [child for child in children if child["kind"] == "NetworkPolicy"]
    target = _pod_labels(children, "engine-generation")
    labels = {"app": "client"} if source == "client" else _pod_labels(children, source)
    port = _container_port(children, "engine-generation", port_name)
    assert _admits(policies, target, labels, port) is allowed
