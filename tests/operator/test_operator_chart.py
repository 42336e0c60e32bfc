"""The Helm chart and the CRD, checked without a cluster: lint, render, schema validation."""

from __future__ import annotations

import json
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_tools import documents, helm
from kvfleet.operator.children import render_children
from kvfleet.operator.names import FleetRef
from kvfleet.operator.spec import FleetSpec, parse_spec
from operator_testkit import CHART_DIR, EXAMPLE_FLEET, POOL_CRD_PATH, crd_schema, load_crd

KUBERNETES_VERSION = "1.32.0"
VALUE_SETS = {
    "defaults": [],
    "namespaced": ["--set", "watchNamespaces={team-a,team-b}"],
    "example": ["--set", "exampleFleet.enabled=true", "--set", "image.tag=0.2.0"],
    "no-sa": ["--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops"],
    "single": ["--set", "replicaCount=1"],
    "monitoring": ["--api-versions", "monitoring.coreos.com/v1"],
}


# helm lint has no --api-versions: the capability-only value set is rendered, not linted.
@pytest.mark.parametrize("name", sorted(set(VALUE_SETS) - {"monitoring"}))
def test_chart_lints_strictly(name):
    """`helm lint --strict` must pass for every value set (also checks values.schema.json)."""
    helm("lint", "--strict", str(CHART_DIR), *VALUE_SETS[name])


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_chart_is_valid_kubernetes(name):
    """Every object `helm template --include-crds` renders must validate strictly for 1.32."""
    rendered = helm("template", "t", str(CHART_DIR), "--include-crds", *VALUE_SETS[name])
    objects = documents(rendered)
    crds = {
        (obj["spec"]["group"], obj["spec"]["names"]["kind"]): obj
        for obj in objects
        if obj["kind"] == "CustomResourceDefinition"
    }
    for obj in objects:
        group, kind = obj["apiVersion"].split("/")[0], obj["kind"]
        if (group, kind) in crds:  # one of the chart's own kinds: its CRD's schema
            schema = crds[group, kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            jsonschema.Draft4Validator(schema).validate(obj)
        elif group == "monitoring.coreos.com":  # the Prometheus Operator's: no schema offline
            assert obj["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    assert ("kvfleet.dev", "KVFleet") in crds


@pytest.mark.parametrize("version", ["1.20.2", "1.31.0"])
def test_the_chart_installs_on_every_kubernetes_it_is_tested_on(version):
    """`helm install` refuses a cluster below the chart's kubeVersion: the floor must admit the
    API server the end-to-end tests run on (v1.20) as well as current ones."""
    rendered = helm("template", "t", str(CHART_DIR), "--kube-version", version)
    assert any(doc["kind"] == "Deployment" for doc in documents(rendered))


def test_every_values_reference_exists():
    """A `.Values.x.y` in a template that values.yaml lacks is a typo lint cannot see."""
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for template in (CHART_DIR / "templates").iterdir():
        for path in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()):
            node = values
            for part in path.split("."):
                assert isinstance(node, dict) and part in node, f"{template.name}: .Values.{path}"
                node = node[part]


def test_values_validate_against_schema():
    """values.yaml must satisfy its own values.schema.json."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate(
        yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    )


def test_example_fleet_validates_against_crd_and_operator():
    """The example fleet must pass the CRD's openAPIV3Schema and the operator's own checks."""
    fleet = yaml.safe_load(EXAMPLE_FLEET.read_text())
    jsonschema.Draft4Validator(crd_schema()).validate(fleet)
    spec = parse_spec(fleet["spec"])
    assert spec.enabled_pools() == ("context", "generation")


def _schema_nodes(node: dict, path: str = ""):
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from _schema_nodes(child, f"{path}.{key}")
    if "items" in node:
        yield from _schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _schema_nodes(node["additionalProperties"], f"{path}{{}}")


def test_crd_schema_is_structural():
    """Every CRD schema node must have a type (structural schema) and valid defaults."""
    for path, node in _schema_nodes(crd_schema()):
        # An int-or-string node (a quantity) is typed by its marker, as in Kubernetes' own.
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        assert typed, f"{path or '<root>'} has no type"
        if "default" in node:
            jsonschema.Draft4Validator(node).validate(node["default"])


def _crd_defaults(node: dict) -> object:
    """The object an API server would default an empty `{}` of this node to."""
    result = {}
    for key, child in node.get("properties", {}).items():
        if "default" in child:
            default = child["default"]
            result[key] = _crd_defaults(child) if default == {} else default
    return result


def test_crd_defaults_equal_operator_defaults():
    """Defaults in the CRD and in the operator's models must agree, or kmock tests lie."""
    spec_schema = crd_schema()["properties"]["spec"]
    minimal = {"model": {"name": "m", "path": "p"}}
    from_crd = FleetSpec.model_validate({**_crd_defaults(spec_schema), **minimal})
    assert from_crd == parse_spec(minimal)


def test_rendered_children_are_valid_kubernetes():
    """Every child the operator renders for the example fleet must validate strictly for 1.32."""
    fleet = yaml.safe_load(EXAMPLE_FLEET.read_text())
    spec = parse_spec(fleet["spec"])
    children = render_children(
        FleetRef("coder", "kvfleet", "uid"), spec, {"context": 1, "generation": 2}
    )
    pool_schema = load_crd(POOL_CRD_PATH)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for child in children:
        if child["kind"] == "KVFleetPool":  # the chart's own kind: its CRD's schema
            jsonschema.Draft4Validator(pool_schema).validate(child)
        else:
            kubernetes_validate.validate(child, KUBERNETES_VERSION, strict=True)
    kinds = {child["kind"] for child in children}
    assert {"Secret", "NetworkPolicy", "PodDisruptionBudget", "StatefulSet", "KVFleetPool"} <= kinds
    assert len(children) == 19


def test_replicas_elect_a_leader_through_peering():
    """Two replicas without peering would both handle every fleet; one needs no peering."""
    two = documents(helm("template", "t", str(CHART_DIR)))
    [deployment] = [obj for obj in two if obj["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert deployment["spec"]["replicas"] == 2
    assert "--peering=t-kvfleet" in args
    assert any(obj["kind"] == "ClusterKopfPeering" for obj in two)
    one = documents(helm("template", "t", str(CHART_DIR), *VALUE_SETS["single"]))
    [deployment] = [obj for obj in one if obj["kind"] == "Deployment"]
    assert not any(
        a.startswith("--peering")
        for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert not any(obj["kind"] == "ClusterKopfPeering" for obj in one)


def test_pod_monitor_only_when_the_api_exists():
    """A PodMonitor on a cluster without the Prometheus Operator fails the whole install."""
    plain = documents(helm("template", "t", str(CHART_DIR)))
    assert not any(obj["kind"] == "PodMonitor" for obj in plain)
    monitored = documents(helm("template", "t", str(CHART_DIR), *VALUE_SETS["monitoring"]))
    assert sum(obj["kind"] == "PodMonitor" for obj in monitored) == 1
