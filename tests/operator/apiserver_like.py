"""kmock made to answer as a real API server does where the operator's comparisons care.

kmock stores and lists objects exactly as sent. A real server lists items without their
`apiVersion` and `kind` (the list names them once) and keeps resource quantities in canonical
form (`1024Mi` comes back as `1Gi`, `1000m` as `1`, an integer GPU count as `"1"`). An operator
that compares text would patch every child on every pass against a real server and never
against plain kmock; lists served through `serve_lists_like_apiserver` show that.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))
QUANTITY_MAPS = ("requests", "limits")


def canonical_quantity(value: Any) -> str:
    """The text the server keeps for a quantity: the largest suffix of the value's own system
    (binary when it was written with one) that divides it exactly, else millis."""
    number = Decimal(parse_quantity(value))
    binary = isinstance(value, str) and value.rstrip().endswith("i")
    for suffix, size in BINARY if binary else DECIMAL:
        if number and number % size == 0:
            return f"{int(number / size)}{suffix}"
    if number == number.to_integral_value():
        return str(int(number))
    return f"{int(number * 1000)}m"


def as_stored(node: Any, quantities: bool = False) -> Any:
    """`node` with every value of a requests/limits map in canonical form."""
    if isinstance(node, dict):
        return {
            key: canonical_quantity(value)
            if quantities and not isinstance(value, dict)
            else as_stored(value, key in QUANTITY_MAPS)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [as_stored(item) for item in node]
    return node


def as_listed(raw: dict) -> dict:
    """One list item as the server sends it."""
    return {k: v for k, v in as_stored(raw).items() if k not in ("apiVersion", "kind")}


def serve_lists_like_apiserver(k8s, plurals: set[str]) -> None:
    """Answer LIST requests of these resources as a real server would (labels not filtered:
    the operator's client filters them itself)."""

    def listing(request) -> dict:
        items = [
            as_listed(obj.raw)
            for (resource, namespace, _), obj in list(k8s.objects.items())
            if resource == request.resource and namespace == request.namespace and not obj.deleted
        ]
        return {"metadata": {"resourceVersion": "1"}, "items": items}

    def wanted(request) -> bool:
        return request.resource is not None and request.resource.plural in plurals

    k8s["list", wanted] << listing
