"""Paths of the shared traces, resolved from this file so tests run from any directory."""

from __future__ import annotations

from pathlib import Path

# The repo root's ../shared/traces.
TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
MOONCAKE_CONVERSATION = TRACES / "mooncake" / "conversation_trace.jsonl"
MOONCAKE_SYNTHETIC = TRACES / "mooncake" / "synthetic_trace.jsonl"
CLAUDE_CODE = TRACES / "claude_code_weka"
