"""Checks of a fleet that its CRD schema cannot express, or that a server without the schema
(an old CRD, a test double) would let through: each problem names the field at fault.

The schema bounds sizes and spells quantities; it cannot see that two ports collide, and on
Kubernetes before 1.25 it cannot limit `metadata.name` at all.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .names import MAX_NAME
from .quantities import quantity

# StatefulSet pods carry the label `controller-revision-hash: <statefulset>-<hash>` (a hash of
# up to 10 characters), and label values stop at 63: a StatefulSet name over 52 characters
# makes pods that cannot be created. The longest child suffix is `-generation`.
REVISION_HASH_CHARS = 11  # "-" and the hash
LONGEST_SUFFIX = "generation"
MAX_FLEET_NAME = MAX_NAME - REVISION_HASH_CHARS - len(LONGEST_SUFFIX) - 1  # 41
# Services are named after the fleet, and a Service name is a DNS-1035 label.
FLEET_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RESOURCE_MAPS = ("requests", "limits")


def name_problems(name: str) -> list[str]:
    """Why a fleet's name would make child names the API server refuses (or cuts)."""
    problems = []
    if len(name) > MAX_FLEET_NAME:
        problems.append(
            f"metadata.name: {json.dumps(name)} is {len(name)} characters; at most "
            f"{MAX_FLEET_NAME} keep its StatefulSets' pod labels within {MAX_NAME} characters"
        )
    if not FLEET_NAME.fullmatch(name):
        problems.append(
            f"metadata.name: {json.dumps(name)} must start with a letter and hold only lowercase "
            "letters, digits and '-' (its Services are named after it)"
        )
    return problems


def _not_quantity(value: Any) -> bool:
    return quantity(value) is None or (isinstance(value, str) and value != value.strip())


def resource_problems(where: str, resources: dict[str, Any]) -> list[str]:
    """Keys of a pool's `resources` other than requests/limits, and values not quantities."""
    problems = []
    for key, entries in resources.items():
        if key not in RESOURCE_MAPS:
            problems.append(f"{where}.{key}: unknown key (requests, limits)")
        elif not isinstance(entries, dict):
            problems.append(f"{where}.{key}: must be a map of resource names to quantities")
        else:
            problems += [
                f"{where}.{key}.{name}: {json.dumps(value)} is not a quantity"
                for name, value in entries.items()
                if _not_quantity(value)
            ]
    return problems


def size_problems(where: str, size: str) -> list[str]:
    """A storage size that is not a quantity."""
    return [f"{where}: {json.dumps(size)} is not a quantity"] if _not_quantity(size) else []


def _collisions(ports: dict[str, range]) -> list[str]:
    names, problems = list(ports), []
    for index, first in enumerate(names):
        for second in names[index + 1 :]:
            a, b = ports[first], ports[second]
            if a.start < b.stop and b.start < a.stop:
                problems.append(f"spec.ports.{first} and spec.ports.{second}: {_span(a, b)}")
    return problems


def _span(a: range, b: range) -> str:
    if len(a) == len(b) == 1:
        return f"both {a.start}"
    return f"{a.start}-{a.stop - 1} and {b.start}-{b.stop - 1} overlap (one port per rank)"


def port_problems(router: dict[str, int], engine: dict[str, int], ranks: int) -> list[str]:
    """Ports one pod would listen on twice: the router's four, and the engine's three bases
    with one port per rank each (rank i on base + i), which must also stay below 65536."""
    problems = _collisions({name: range(port, port + 1) for name, port in router.items()})
    spans = {name: range(port, port + ranks) for name, port in engine.items()}
    problems += _collisions(spans)
    problems += [
        f"spec.ports.{name}: {span.start} + {ranks} ranks passes 65535"
        for name, span in spans.items()
        if span.stop - 1 > 65535
    ]
    return problems
