"""The assistant's content blocks: its text, and the tool calls in it as `tool_use` blocks.

Tool-call parsing of the model's output is not here: `parse_output` and `OutputPieces` are the
seam where services/engine/tool_calls.py (`parse_tool_calls`, `ToolCallStream`) plugs in; until
it does, the whole output is one text block. Everything after the seam (block shapes, the
stream's content_block_start / delta / stop events, stop_reason `tool_use`) already handles
tool calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .anthropic_shapes import event


@dataclass(frozen=True)
class ToolUse:
    """One call the model made; `arguments` is JSON text of an object."""

    id: str
    name: str
    arguments: str


def parse_output(text: str, tools_offered: bool) -> tuple[str, list[ToolUse]]:
    """SEAM: the text that is not a call, and the calls (tool_calls.parse_tool_calls)."""
    del tools_offered  # the parser runs only when the request offered tools
    return text, []


class OutputPieces:
    """SEAM: the streamed output split into text and calls (tool_calls.ToolCallStream)."""

    def __init__(self, tools_offered: bool) -> None:
        self.tools_offered = tools_offered

    def feed(self, text: str) -> list[str | ToolUse]:
        return [text] if text else []

    def finish(self) -> list[str | ToolUse]:
        return []


def content_blocks(text: str, calls: list[ToolUse]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text or not calls else []
    blocks += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments)}
        for c in calls
    ]
    return blocks


class BlockEvents:
    """The content_block_* events of a stream, one block open at a time."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "text" while a text block takes deltas
        self.tool_calls = 0

    def piece(self, piece: str | ToolUse) -> list[str]:
        if isinstance(piece, ToolUse):
            self.tool_calls += 1
            start = {"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": piece.arguments}
            return [
                *self.close(),
                *self._start(start),
                event("content_block_delta", {"index": self.index, "delta": delta}),
                *self.close(),
            ]
        if not piece:
            return []
        lines = [] if self.open == "text" else self._start({"type": "text", "text": ""})
        self.open = "text"
        delta = {"type": "text_delta", "text": piece}
        return [*lines, event("content_block_delta", {"index": self.index, "delta": delta})]

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]

    def finish(self) -> list[str]:
        """Close the last block; a message with no content still gets an empty text block."""
        if self.index < 0:
            return [*self._start({"type": "text", "text": ""}), *self.close()]
        return self.close()

    def _start(self, block: dict[str, Any]) -> list[str]:
        self.index += 1
        self.open = block["type"]
        return [event("content_block_start", {"index": self.index, "content_block": block})]
