"""Pure planning of child changes: desired manifests vs live objects -> the fewest API calls.

Level-triggered: a child is compared with what is live now, not only with what was applied
last, so a tampered field (a patched image, a scaled StatefulSet) or a deleted child is put
back on the next pass. Each child also carries the manifest it was last applied from (an
annotation, as `kubectl apply` does), so a field the spec no longer sets becomes `null`.
Fields the API server or others filled in (defaults, extra annotations) are left alone: the
desired manifest need only be contained in the live object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from .children import Resource, resource_of
from .names import GROUP
from .quantities import QUANTITY_MAPS, same_quantity
from .render_scaling import without_scaler_owned
from .render_secret import with_new_secret

LAST_APPLIED_ANNOTATION = f"{GROUP}/last-applied"


@dataclass(frozen=True)
class ChildAction:
    """One API call on one child: create (body), patch (merge patch), or delete."""

    verb: Literal["create", "patch", "delete"]
    resource: Resource
    name: str
    body: dict[str, Any] | None = None

    @property
    def kind_name(self) -> str:
        return f"{self.resource.plural}/{self.name}"


def merge_diff(old: Any, new: Any) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns dict `old` into dict `new`."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif isinstance(value, dict) and isinstance(old[key], dict):
            nested = merge_diff(old[key], value)
            if nested:
                patch[key] = nested
        elif value != old[key]:
            patch[key] = value
    return patch


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def contained(desired: Any, live: Any, quantities: bool = False) -> bool:
    """Whether `live` holds everything `desired` says (server defaults in `live` are fine;
    an empty map or list in `desired` matches a field the server dropped). `quantities`:
    `desired` is a `requests`/`limits` map or a value in one, compared by value (the server
    rewrites their text)."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return _empty(desired) and live is None
        return all(
            contained(value, live[key], quantities or key in QUANTITY_MAPS)
            if key in live
            else _empty(value)
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        if live is None:
            return not desired
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(contained(d, item) for d, item in zip(desired, live, strict=True))
        )
    return desired == live or (quantities and same_quantity(desired, live))


def drift_patch(
    desired: dict[str, Any], live: dict[str, Any], quantities: bool = False
) -> dict[str, Any]:
    """The merge patch that puts back every field of `desired` that `live` lost or changed
    (`quantities`: `desired` is a requests/limits map, see `contained`)."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        current = live.get(key)
        if key not in live and _empty(value):
            continue
        if isinstance(value, dict) and isinstance(current, dict):
            nested = drift_patch(value, current, key in QUANTITY_MAPS)
            if nested:
                patch[key] = nested
        elif not contained(value, current, quantities):
            patch[key] = value
    return patch


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in, key by key (extra wins)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def with_last_applied(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as sent to the API: itself plus its own serialisation in an annotation."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    metadata = dict(manifest["metadata"])
    metadata["annotations"] = {**metadata.get("annotations", {}), LAST_APPLIED_ANNOTATION: text}
    return {**manifest, "metadata": metadata}


def last_applied(live: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest a live child was last applied from, or None if the operator never applied it."""
    text = live.get("metadata", {}).get("annotations", {}).get(LAST_APPLIED_ANNOTATION)
    return json.loads(text) if text else None


def plan_children(desired: list[dict], live: dict[tuple[Resource, str], dict]) -> list[ChildAction]:
    """Actions that make `live` (keyed by (resource, name)) match `desired`, creations in order.

    Live children that are no longer desired are deleted; unchanged ones produce no action; a
    live child that drifted from its manifest is patched back.
    """
    actions: list[ChildAction] = []
    wanted: set[tuple[Resource, str]] = set()
    for manifest in desired:
        resource, name = resource_of(manifest), manifest["metadata"]["name"]
        wanted.add((resource, name))
        current = live.get((resource, name))
        if current is None:
            stamped = with_last_applied(without_scaler_owned(manifest))
            body = {**manifest, "metadata": stamped["metadata"]}
            if manifest["kind"] == "Secret":
                body = with_new_secret(body)  # the value is made once, never in last-applied
            actions.append(ChildAction("create", resource, name, body))
            continue
        # Fields others own after creation (a pool's replicas: its scalers') are left to them.
        previous = without_scaler_owned(last_applied(current) or {})
        target = with_last_applied(without_scaler_owned(manifest))
        body = deep_merge(
            merge_diff(with_last_applied(previous), target) if previous else {},
            drift_patch(target, current),
        )
        if body:
            actions.append(ChildAction("patch", resource, name, body))
    for resource, name in live:
        if (resource, name) not in wanted:
            actions.append(ChildAction("delete", resource, name))
    return actions
