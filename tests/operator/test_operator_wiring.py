"""Every CR field is wired: changing it changes what the operator renders (children, engine.yaml,
command lines) or what the autoscaler does; a field that did nothing would be a silent lie."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kvfleet.operator.children import render_children
from kvfleet.operator.names import FleetRef
from kvfleet.operator.scaling_state import policy_for
from kvfleet.operator.spec import SpecError, parse_spec
from operator_testkit import crd_schema

FLEET = FleetRef("f", "ns", "uid")
# Room for every single-field change to stay valid (ranksPerPod 2 needs 2 GPUs, for instance).
BASE = {
    "model": {"name": "m", "path": "p"},
    "pools": {"context": {"gpusPerPod": 2}, "generation": {"gpusPerPod": 2}},
}
# Fields that only mean something next to another value, given with it.
EXTERNAL_URL = {"redis": {"mode": "external", "url": "redis://r:6379/0"}}
EXTERNAL_SECRET = {"redis": {"mode": "external", "urlSecretRef": {"name": "s", "key": "url"}}}
WITH = {
    "redis.url": EXTERNAL_URL,
    "redis.urlSecretRef.name": EXTERNAL_SECRET,
    "redis.urlSecretRef.key": EXTERNAL_SECRET,
}


def leaves(node: dict, path: str = "") -> list[tuple[str, dict]]:
    """(dotted path, schema) of every leaf field of the spec schema."""
    props = node.get("properties")
    if not props:
        return [(path, node)]
    return [
        item for key, child in props.items() for item in leaves(child, f"{path}.{key}".lstrip("."))
    ]


def changed_value(path: str, schema: dict, given: Any = None) -> Any:
    """A valid value other than the default (or than the one `given`)."""
    kind, default = schema.get("type"), schema.get("default")
    if given is not None:
        default = given
    if "enum" in schema:
        return next(v for v in schema["enum"] if v != default)
    if kind == "boolean":
        return not default
    if kind == "integer":
        base = default if default is not None else schema.get("minimum", 1)
        return base + 1 if schema.get("maximum", base + 2) > base else base - 1
    if kind == "number":
        top = schema.get("maximum", (default or 1) * 4)
        return ((default or 0) + top) / 2 if default is not None else top / 2
    if kind == "string":
        return "redis://other:6379/0" if path == "redis.url" else "other-value"
    if kind == "object":
        if path.endswith((".requests", ".limits")):
            return {"cpu": "3"}
        return {"requests": {"cpu": "3"}} if path.endswith("resources") else {"k": "v"}
    if kind == "array":
        return [{"key": "k", "operator": "Exists"}]
    raise AssertionError(f"no changed value for {path} ({kind})")


def with_value(spec: dict, path: str, value: Any) -> dict:
    out = copy.deepcopy(spec)
    node = out
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def observed(raw: dict) -> Any:
    """Everything a spec makes the operator do: its children and each pool's autoscaling (or
    the InvalidSpec it reports)."""
    try:
        spec = parse_spec(raw)
    except SpecError as exc:
        return ("InvalidSpec", str(exc))
    replicas = {name: spec.pool(name).replicas for name in spec.enabled_pools()}
    return (
        render_children(FLEET, spec, replicas),
        {name: policy_for(spec, name) for name in spec.enabled_pools()},
        # Read by the handlers themselves: whether to autoscale, how often.
        (spec.autoscaling.enabled, spec.autoscaling.interval_seconds),
    )


def merged(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


SPEC_LEAVES = leaves(crd_schema()["properties"]["spec"])


@pytest.mark.parametrize(("path", "schema"), SPEC_LEAVES, ids=[p for p, _ in SPEC_LEAVES])
def test_every_crd_field_changes_what_the_operator_does(path, schema):
    """A CRD field that changes nothing is never wired: wire it or remove it from the CRD."""
    before = merged(BASE, WITH.get(path, {}))
    after = with_value(before, path, changed_value(path, schema, current(before, path)))
    assert observed(after) != observed(before), f"spec.{path} changes nothing"


def current(spec: dict, path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _drop_none(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _drop_none(v) for k, v in node.items() if v is not None}
    return node


BOUNDED = [(path, schema) for path, schema in SPEC_LEAVES if "maximum" in schema]


@pytest.mark.parametrize(("path", "schema"), BOUNDED, ids=[p for p, _ in BOUNDED])
def test_every_crd_maximum_is_the_operators_too(path, schema):
    """Where the CRD has no say (an old CRD, a test double) the operator must refuse the same
    values, naming the field."""
    too_big = schema["maximum"] + 1
    with pytest.raises(SpecError, match=rf"spec\.{path}: "):
        parse_spec(with_value(BASE, path, too_big))
