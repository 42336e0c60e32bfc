"""Tool calls in a model's text: which syntax a checkpoint uses, and the calls it made.

Public API (the OpenAI and Anthropic HTTP layers both call these):

- `ToolCall(id, name, arguments)`: one call; `arguments` is JSON text (an object), `id` is
  `call_` + random hex, except for `mistral`: 9 random letters and digits, the only ids
  Mistral's chat templates accept when the call comes back in the history.
- `parse_tool_calls(text, family, *, tools=None) -> (content, calls)`: the whole output at
  once; `content` is the text that is not a call (whitespace around calls dropped; "" when
  nothing is left).
- `ToolCallStream(family, *, tools=None)`: the same, fed piece by piece. `feed(delta_text)` and
  `finish()` return lists of `ContentDelta(text)` and `ToolCallDelta(index, id, name,
  arguments)` events: text that may be the start of a call is held back until it is decided; a
  call is sent once it is complete, as a first delta with index, id and name (arguments "")
  then one with its arguments, so a stream never shows a call that the whole text would not
  hold. Concatenating the events gives exactly what `parse_tool_calls` returns, however the
  text was split; `stream.calls` lists the whole calls sent so far.
- `family_for_checkpoint(chat_template, architecture=None) -> family | None`: the syntax a
  checkpoint's chat template teaches its model (its markers), else the architecture's usual
  one (`architecture`: config.json's `architectures[0]` or `model_type`, or that config as a
  dict); None when neither says.
- `resolve_tool_family(flag, chat_template, model_path)`: what the `--tool-call-parser` flag
  means: "auto" (family_for_checkpoint over the checkpoint's config.json), "none", or a family.
- `FAMILIES`: "llama3_json", "mistral", "hermes", "qwen3_coder" (syntax in tool_parsers.py).

`tools` (the request's OpenAI tool list) only matters to qwen3_coder, whose parameter values
are text: they are converted to the types the tool's JSON schema declares. Malformed or cut-off
calls stay content, never an error.
"""

from __future__ import annotations

import argparse
import json
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tool_parsers import TAKES, ParsedCall, Tools

FAMILIES = tuple(TAKES)
PARSER_FLAG_CHOICES = ("auto", "none", *FAMILIES)


def add_tool_call_parser_flag(parser: argparse.ArgumentParser) -> None:
    """`--tool-call-parser`, the same on every command that serves chat (engine, router, up)."""
    parser.add_argument(
        "--tool-call-parser",
        choices=PARSER_FLAG_CHOICES,
        default="auto",
        help="tool-call syntax parsed from chat answers: auto (from the chat template, else "
        "the architecture), none (calls stay text), or a family",
    )


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One streamed piece of call `index`: id and name come once, in its first delta."""

    index: int
    id: str | None
    name: str | None
    arguments: str


Event = ContentDelta | ToolCallDelta


_ALPHANUMERIC = string.ascii_letters + string.digits


def new_call_id(family: str = "") -> str:
    if family == "mistral":  # its templates raise on any id but 9 alphanumerics
        return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"


class ToolCallStream:
    """Content and tool-call deltas of one output, fed as it is generated."""

    def __init__(self, family: str, *, tools: Tools | None = None) -> None:
        if family not in TAKES:
            raise ValueError(f"unknown tool-call family {family!r}; known: {FAMILIES}")
        self._family = family
        self._take = TAKES[family]
        self._tools = tools
        self._pending = ""  # text not decided yet
        self._consumed = 0  # characters decided so far (llama3_json reads JSON only at 0)
        self._held_space = ""  # whitespace not sent yet (see _content)
        self._sent_content = False
        self.calls: list[ToolCall] = []

    def feed(self, delta_text: str) -> list[Event]:
        self._pending += delta_text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        events = self._run(final=True)
        if not self.calls and self._held_space:
            events.append(ContentDelta(self._held_space))
        self._held_space = ""
        return events

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while self._pending:
            step = self._take(self._pending, self._consumed == 0, final, self._tools)
            if step.size == 0:
                break
            piece, self._pending = self._pending[: step.size], self._pending[step.size :]
            self._consumed += step.size
            if step.calls:
                events += self._calls(step.calls)
            else:
                events += self._content(piece)
        return events

    def _calls(self, parsed: tuple[ParsedCall, ...]) -> list[Event]:
        if not self._sent_content:
            self._held_space = ""
        events: list[Event] = []
        for call in parsed:
            index, call_id = len(self.calls), new_call_id(self._family)
            self.calls.append(ToolCall(call_id, call.name, call.arguments))
            events += [
                ToolCallDelta(index, call_id, call.name, ""),
                ToolCallDelta(index, None, None, call.arguments),
            ]
        return events

    def _content(self, piece: str) -> list[Event]:
        # Whitespace waits for the next visible text: the newlines a model writes around a
        # call are layout, dropped when no visible text precedes them or none follows.
        body = piece.rstrip()
        trailing = piece[len(body) :]
        if not body:
            self._held_space += piece
            return []
        if self.calls and not self._sent_content:
            self._held_space, body = "", body.lstrip()
        text, self._held_space = self._held_space + body, trailing
        self._sent_content = True
        return [ContentDelta(text)]


def parse_tool_calls(
    text: str, family: str, *, tools: Tools | None = None
) -> tuple[str, list[ToolCall]]:
    """The content left over and the calls of a whole output (see the module docstring)."""
    stream = ToolCallStream(family, tools=tools)
    events = stream.feed(text) + stream.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return content, stream.calls


# Markers a chat template writes when it teaches its model a call syntax; the first match
# wins, so the more specific qwen3_coder comes before hermes.
_TEMPLATE_MARKERS = (
    ("qwen3_coder", ("<tool_call>", "<function=")),
    ("hermes", ("<tool_call>",)),
    ("mistral", ("[TOOL_CALLS]",)),
    ("llama3_json", ("<|python_tag|>",)),
    ("llama3_json", ("ipython",)),
)
# When the template does not say: the syntax each architecture's released models use.
_ARCHITECTURE_FAMILIES = (
    ("Qwen3Moe", "hermes"),
    ("Qwen", "hermes"),
    ("Mixtral", "mistral"),
    ("Mistral", "mistral"),
    ("Llama", "llama3_json"),
)


def family_for_checkpoint(
    chat_template: str | None, architecture: str | Mapping[str, Any] | None = None
) -> str | None:
    """The tool-call family of a checkpoint: by its chat template, else its architecture
    (`config.json`'s architectures[0] or model_type, or that config); None when neither tells."""
    if isinstance(architecture, Mapping):
        architecture = architecture_of(architecture)
    for family, markers in _TEMPLATE_MARKERS:
        if chat_template and all(marker in chat_template for marker in markers):
            return family
    for prefix, family in _ARCHITECTURE_FAMILIES:
        if architecture and architecture.lower().startswith(prefix.lower()):
            return family
    return None


def checkpoint_architecture(model_path: str | None) -> str | None:
    """architectures[0] (else model_type) of `model_path/config.json`; None without one."""
    if not model_path or not (Path(model_path) / "config.json").is_file():
        return None
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except ValueError:
        return None
    return architecture_of(config) if isinstance(config, dict) else None


def architecture_of(config: Mapping[str, Any]) -> str | None:
    """architectures[0] of a config.json, else its model_type."""
    architectures = config.get("architectures") or [config.get("model_type")]
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    return first if isinstance(first, str) else None


def resolve_tool_family(
    flag: str, chat_template: str | None, model_path: str | None = None
) -> str | None:
    """The family `--tool-call-parser FLAG` selects; None: tool calls stay text."""
    if flag == "none":
        return None
    if flag == "auto":
        return family_for_checkpoint(chat_template, checkpoint_architecture(model_path))
    if flag not in FAMILIES:
        raise ValueError(f"--tool-call-parser {flag!r}: not one of {PARSER_FLAG_CHOICES}")
    return flag
