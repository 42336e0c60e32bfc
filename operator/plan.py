"""Pure planning of child changes: desired manifests vs live objects -> the fewest API calls.

Each child carries the manifest it was last applied from (an annotation, as `kubectl apply`
does), so an update sends a merge patch of exactly what changed, with `null` for what the
spec no longer sets, and leaves alone the fields the API server or others filled in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from .children import Resource, resource_of
from .names import GROUP

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

    Live children that are no longer desired are deleted; unchanged ones produce no action.
    """
    actions: list[ChildAction] = []
    wanted: set[tuple[Resource, str]] = set()
    for manifest in desired:
        resource, name = resource_of(manifest), manifest["metadata"]["name"]
        wanted.add((resource, name))
        current = live.get((resource, name))
        if current is None:
            actions.append(ChildAction("create", resource, name, with_last_applied(manifest)))
            continue
        previous = last_applied(current) or {}
        if previous != manifest:
            body = merge_diff(
                with_last_applied(previous) if previous else {}, with_last_applied(manifest)
            )
            actions.append(ChildAction("patch", resource, name, body))
    for resource, name in live:
        if (resource, name) not in wanted:
            actions.append(ChildAction("delete", resource, name))
    return actions
