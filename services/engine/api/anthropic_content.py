"""The assistant's content blocks: its text, and the tool calls in it as `tool_use` blocks.

The calls are parsed from the model's text by services/engine/api/tool_calls.py in the family the
app knows (`tool_family` of build_app); `parse_output` splits a whole output, `OutputPieces` a
streamed one. Without a family, or when the request offered no tools (or `tool_choice` is
`none`), the whole output is one text block. A malformed call stays text: the parser never
turns what it cannot read into a call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .anthropic_shapes import event
from .tool_calls import ContentDelta, ToolCallStream, parse_tool_calls

ANTHROPIC_ID_PREFIX = "toolu_"


@dataclass(frozen=True)
class ToolUse:
    """One call the model made; `arguments` is JSON text of an object."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolParsing:
    """How a request's output is parsed: the family's syntax, and the request's tools as
    OpenAI function tools (qwen3_coder types its parameter values by their schemas)."""

    family: str
    tools: Sequence[dict[str, Any]]


def tool_use_id(call_id: str, family: str) -> str:
    """Anthropic's `toolu_` id for a parsed call. Mistral keeps its own 9 alphanumerics: its
    chat templates refuse any other id when the call comes back in the next turn."""
    if family == "mistral":
        return call_id
    return ANTHROPIC_ID_PREFIX + call_id.removeprefix("call_")


def parse_output(text: str, parsing: ToolParsing | None) -> tuple[str, list[ToolUse]]:
    """The text that is not a call, and the calls (all text when `parsing` is None)."""
    if parsing is None:
        return text, []
    content, calls = parse_tool_calls(text, parsing.family, tools=parsing.tools)
    uses = [ToolUse(tool_use_id(c.id, parsing.family), c.name, c.arguments) for c in calls]
    return content, uses


class OutputPieces:
    """The streamed output split into text and whole calls (tool_calls.ToolCallStream holds
    back text that may start a call until it is decided)."""

    def __init__(self, parsing: ToolParsing | None) -> None:
        self.parsing = parsing
        self._stream = (
            ToolCallStream(parsing.family, tools=parsing.tools) if parsing is not None else None
        )
        self._started: tuple[str, str] | None = None  # (id, name) of the call being sent

    def feed(self, text: str) -> list[str | ToolUse]:
        if self._stream is None:
            return [text] if text else []
        return self._pieces(self._stream.feed(text) if text else [])

    def finish(self) -> list[str | ToolUse]:
        return self._pieces(self._stream.finish()) if self._stream is not None else []

    def _pieces(self, events: list) -> list[str | ToolUse]:
        # The stream sends a call only once it is whole: a first delta with id and name, then
        # one with all its arguments; a tool_use block is sent as one start, delta and stop.
        pieces: list[str | ToolUse] = []
        for item in events:
            if isinstance(item, ContentDelta):
                pieces.append(item.text)
            elif item.id is not None:
                self._started = (tool_use_id(item.id, self.parsing.family), item.name)
            elif self._started is not None:
                call_id, name = self._started
                pieces.append(ToolUse(call_id, name, item.arguments))
                self._started = None
        return pieces


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
