"""Resource quantities compared by value, as the API server stores them.

The server keeps a quantity in its canonical form (`1024Mi` comes back as `1Gi`, an integer
GPU count as the string `"1"`), so comparing a rendered manifest with a live object as text
would see a change that is none, and patch it back on every pass.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

# The maps whose values are quantities, wherever they appear: a container's `resources` and a
# PersistentVolumeClaim's `spec.resources` (storage).
QUANTITY_MAPS = frozenset({"requests", "limits"})


def quantity(value: Any) -> Decimal | None:
    """The value of a quantity (a string such as `1Gi`, `250m`, or a number); None when it is
    not one (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    try:
        return Decimal(parse_quantity(value))
    except ValueError:
        return None


def same_quantity(desired: Any, live: Any) -> bool:
    """Whether two spellings are the same quantity (`1024Mi` and `1Gi`, `1` and `"1"`)."""
    wanted = quantity(desired)
    return wanted is not None and wanted == quantity(live)
