"""Helpers shared by the operator tests (a unique module name: test folders have no packages)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "kvfleet"
CRD_PATH = CHART_DIR / "crds" / "kvfleets.kvfleet.dev.yaml"
EXAMPLE_FLEET = CHART_DIR / "examples" / "fleet.yaml"
NAMESPACE = "ns1"
FLEETS = "kvfleet.dev/v1alpha1/kvfleets"


def load_crd() -> dict[str, Any]:
    """The chart's CRD, so the tests and the chart cannot drift apart."""
    return yaml.safe_load(CRD_PATH.read_text())


def crd_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the CRD's only version."""
    return load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


async def eventually(check: Callable[[], Any], timeout: float = 60.0, step: float = 0.05) -> Any:
    """Poll `check` until it returns a truthy value (returned) or fail after `timeout` seconds
    (generous: on a loaded machine the operator is slower, and only a failure waits it out)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (KeyError, LookupError, ValueError) as exc:
            last_error = exc
        await asyncio.sleep(step)
    raise AssertionError(f"condition not met within {timeout}s (last error: {last_error!r})")
