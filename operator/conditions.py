"""Status conditions in the Kubernetes convention: one entry per type, transitions timestamped."""

from __future__ import annotations

import datetime
from typing import Any


def now_rfc3339() -> str:
    """The current UTC time as Kubernetes timestamps spell it."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """A new conditions list with `type_` set; lastTransitionTime moves only when status flips."""
    status_text = "True" if status else "False"
    previous = next((c for c in conditions if c.get("type") == type_), None)
    changed = previous is None or previous.get("status") != status_text
    condition = {
        "type": type_,
        "status": status_text,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now if changed else previous.get("lastTransitionTime", now),
    }
    return [c for c in conditions if c.get("type") != type_] + [condition]
