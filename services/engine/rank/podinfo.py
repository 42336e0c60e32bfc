"""The rank's own pod annotations, as the downward API mounts them (the scale-in drain mark).

The operator annotates a leaving pod `kvfleet.dev/draining: "true"`; Kubernetes rewrites
`<podinfo-dir>/annotations` (one `key="value"` line per annotation, values quoted as Go's %q)
and the rank reads it at each heartbeat, so the router stops placing new conversations here.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

log = logging.getLogger(__name__)

DRAINING_ANNOTATION = "kvfleet.dev/draining"
DEFAULT_PODINFO_DIR = "/etc/podinfo"


def parse_annotations(text: str) -> dict[str, str]:
    """Annotations from the downward API's file; lines that do not parse are skipped."""
    annotations = {}
    for line in text.splitlines():
        key, sep, quoted = line.partition("=")
        if not sep or not key:
            continue
        try:
            value = ast.literal_eval(quoted)  # Go's %q escapes are Python string escapes
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str):
            annotations[key.strip()] = value
    return annotations


class PodInfo:
    """Reads the annotations file on each call (Kubernetes updates it in place)."""

    def __init__(self, directory: str | Path | None = DEFAULT_PODINFO_DIR) -> None:
        self.path = Path(directory) / "annotations" if directory else None

    def annotations(self) -> dict[str, str]:
        """The pod's annotations now; empty outside Kubernetes or when the file is unreadable."""
        if self.path is None:
            return {}
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as error:
            log.warning("podinfo %s unreadable (%s): not draining", self.path, error)
            return {}
        return parse_annotations(text)

    def draining(self) -> bool:
        """True while the operator marks this pod as leaving."""
        return self.annotations().get(DRAINING_ANNOTATION, "").strip().lower() == "true"
