"""Paths of the shared traces, resolved from this file so tests run from any directory."""

from __future__ import annotations

import os
from pathlib import Path

# The repo root's ../shared/traces; KVFLEET_SHARED names the shared folder when the checkout
# lives elsewhere (a git worktree).
SHARED = Path(
    os.environ.get("KVFLEET_SHARED") or Path(__file__).resolve().parents[2] / ".." / "shared"
)
TRACES = SHARED / "traces"
MOONCAKE_CONVERSATION = TRACES / "mooncake" / "conversation_trace.jsonl"
MOONCAKE_SYNTHETIC = TRACES / "mooncake" / "synthetic_trace.jsonl"
CLAUDE_CODE = TRACES / "claude_code_weka"
