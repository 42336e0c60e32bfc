"""Per-family tool-call syntax: one step over the front of a model's text at a time.

Each family's `take(text, at_start, final)` looks at the start of the not-yet-decided text and
answers with a `Step`: so many characters of content, so many characters that form calls, or
(only while more text may come) wait. The streaming parser and the whole-text parser in
tool_calls.py both run these steps, so a stream split anywhere decides exactly what the whole
text decides. Anything that does not parse as a call is content: a model's malformed call is
shown as it wrote it, never dropped and never an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Tools = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class ParsedCall:
    """A call before it gets an id: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Step:
    """`size` characters of the text are content (`calls` None) or calls; size 0 means wait."""

    size: int
    calls: tuple[ParsedCall, ...] | None = None


WAIT = Step(0)
Take = Callable[[str, bool, bool, Tools | None], Step]
_DECODER = json.JSONDecoder()


def held_marker_prefix(text: str, markers: Sequence[str]) -> int:
    """How many trailing characters of `text` could be the start of one of `markers`."""
    return max(
        (k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])),
        default=0,
    )


def content_before(text: str, markers: Sequence[str], final: bool) -> Step:
    """Content up to the first marker, holding back a tail that may begin one."""
    found = [i for i in (text.find(m) for m in markers) if i >= 0]
    if found:
        return Step(min(found)) if min(found) > 0 else WAIT
    if final:
        return Step(len(text))
    keep = held_marker_prefix(text, markers)
    return Step(len(text) - keep) if len(text) > keep else WAIT


def call_from_object(item: Any) -> ParsedCall | None:
    """`{"name": ..., "arguments"|"parameters": {...}}` as a call; None when it is not one."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(item["name"], json.dumps(arguments, ensure_ascii=False))


def skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def decode_json(text: str, at: int) -> tuple[Any, int] | None:
    """The JSON value starting at `at` (after whitespace) and where it ends; None if none."""
    try:
        return _DECODER.raw_decode(text, skip_space(text, at))
    except ValueError:
        return None


# --- hermes (Qwen2, Qwen2.5, Qwen3): <tool_call>{"name": ..., "arguments": {...}}</tool_call>

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def _tagged(text: str, final: bool, body: Callable[[str], ParsedCall | None]) -> Step:
    """A `<tool_call>...</tool_call>` block at the front of `text`, its body read by `body`."""
    if not text.startswith(TOOL_CALL_OPEN):
        return content_before(text, (TOOL_CALL_OPEN,), final)
    end = text.find(TOOL_CALL_CLOSE)
    if end < 0 and not final:
        return WAIT
    # Without its closing tag (the output was cut, or the model stopped right after the body)
    # the rest of the text is the body: a complete call still counts.
    inner = text[len(TOOL_CALL_OPEN) : end if end >= 0 else len(text)]
    size = end + len(TOOL_CALL_CLOSE) if end >= 0 else len(text)
    call = body(inner)
    return Step(size, (call,)) if call else Step(size)


def _hermes_body(inner: str) -> ParsedCall | None:
    try:
        return call_from_object(json.loads(inner))
    except ValueError:
        return None


def take_hermes(text: str, at_start: bool, final: bool, tools: Tools | None) -> Step:
    return _tagged(text, final, _hermes_body)


# --- qwen3_coder: <tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>

_FUNCTION = re.compile(r"\s*<function=([^>\s]+)>(.*?)</function>\s*$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)


def _schema_types(tools: Tools | None, name: str) -> dict[str, Any]:
    """The declared JSON-schema type of each parameter of tool `name` ({} when unknown)."""
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties") or {}
            if isinstance(properties, Mapping):
                return {k: v.get("type") for k, v in properties.items() if isinstance(v, Mapping)}
    return {}


def typed_value(raw: str, kind: Any) -> Any:
    """A parameter's text as the schema's type says; the text itself when it does not fit."""
    kinds = kind if isinstance(kind, list) else [kind]
    for one in kinds:
        try:
            if one == "integer":
                return int(raw)
            if one == "number":
                number = float(raw)
                return int(number) if number.is_integer() and "." not in raw else number
            if one == "boolean" and raw.lower() in ("true", "false"):
                return raw.lower() == "true"
            if one == "null" and raw.lower() in ("null", "none"):
                return None
            if one in ("object", "array"):
                value = json.loads(raw)
                if isinstance(value, dict if one == "object" else list):
                    return value
        except ValueError:
            continue
    return raw


def _qwen3_coder_body(inner: str, tools: Tools | None) -> ParsedCall | None:
    match = _FUNCTION.match(inner)
    if not match:
        return None
    name, params = match.group(1), match.group(2)
    types = _schema_types(tools, name)
    arguments = {}
    for key, value in _PARAMETER.findall(params):
        # The template writes each value between newlines; those are layout, not the value.
        value = value.removeprefix("\n").removesuffix("\n")
        arguments[key] = typed_value(value, types.get(key, "string"))
    # Anything but whitespace between parameters means the block is not what we think it is.
    if _PARAMETER.sub("", params).strip():
        return None
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"


def _bare_function(text: str, final: bool, tools: Tools | None) -> Step:
    """A `<function=...>...</function>` block without its `<tool_call>` opener (Qwen3-Coder
    drops it at times), with the `</tool_call>` that may still close it."""
    end = text.find(FUNCTION_CLOSE)
    if end < 0:
        return Step(len(text)) if final else WAIT
    size = end + len(FUNCTION_CLOSE)
    rest = text[size:].lstrip()
    if not final and TOOL_CALL_CLOSE.startswith(rest) and rest != TOOL_CALL_CLOSE:
        return WAIT  # a closing tag may be on its way
    if rest.startswith(TOOL_CALL_CLOSE):
        size = len(text) - len(rest) + len(TOOL_CALL_CLOSE)
    call = _qwen3_coder_body(text[: end + len(FUNCTION_CLOSE)], tools)
    return Step(size, (call,)) if call else Step(size)


def take_qwen3_coder(text: str, at_start: bool, final: bool, tools: Tools | None) -> Step:
    if text.startswith(FUNCTION_OPEN):
        return _bare_function(text, final, tools)
    if text.startswith(TOOL_CALL_OPEN):
        return _tagged(text, final, lambda inner: _qwen3_coder_body(inner, tools))
    return content_before(text, (TOOL_CALL_OPEN, FUNCTION_OPEN), final)


# --- mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]  or  [TOOL_CALLS]name[ARGS]{...}

MISTRAL_MARKER = "[TOOL_CALLS]"
_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)(?:\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\]")


def take_mistral(text: str, at_start: bool, final: bool, tools: Tools | None) -> Step:
    if not text.startswith(MISTRAL_MARKER):
        return content_before(text, (MISTRAL_MARKER,), final)
    at = len(MISTRAL_MARKER)
    named = _MISTRAL_NAMED.match(text, at)
    if named:  # the newer form: name, optional call id, then the arguments object
        decoded = decode_json(text, named.end())
        if decoded and isinstance(decoded[0], dict):
            arguments = json.dumps(decoded[0], ensure_ascii=False)
            return Step(decoded[1], (ParsedCall(named.group(1), arguments),))
    else:
        decoded = decode_json(text, at)
        if decoded:
            items = decoded[0] if isinstance(decoded[0], list) else [decoded[0]]
            calls = [call_from_object(item) for item in items]
            if calls and all(calls):
                return Step(decoded[1], tuple(c for c in calls if c))
            return Step(decoded[1])  # JSON, but not calls: the model's text as it wrote it
    return Step(len(text)) if final else WAIT


# --- llama3_json: {"name": ..., "parameters": {...}} at the start (or after <|python_tag|>),
# several separated by `;`

PYTHON_TAG = "<|python_tag|>"


def _llama_calls(text: str, at: int, final: bool) -> Step:
    calls: list[ParsedCall] = []
    while True:
        decoded = decode_json(text, at)
        if decoded is None:
            if not final:
                return WAIT
            return Step(at, tuple(calls)) if calls else Step(len(text))
        call = call_from_object(decoded[0])
        if call is None:  # JSON that is not a call: the model's answer
            return Step(at, tuple(calls)) if calls else Step(decoded[1])
        calls.append(call)
        at = skip_space(text, decoded[1])
        if at == len(text) and not final:
            return WAIT  # a `;` and another call may follow
        if at < len(text) and text[at] == ";":
            at += 1
            continue
        return Step(at if at == len(text) else decoded[1], tuple(calls))


def take_llama3_json(text: str, at_start: bool, final: bool, tools: Tools | None) -> Step:
    if text.startswith(PYTHON_TAG):
        return _llama_calls(text, len(PYTHON_TAG), final)
    if at_start:
        at = skip_space(text, 0)
        if at == len(text):
            return Step(len(text)) if final and text else WAIT
        if text[at] == "{":
            return _llama_calls(text, at, final)
    return content_before(text, (PYTHON_TAG,), final)


TAKES: dict[str, Take] = {
    "llama3_json": take_llama3_json,
    "mistral": take_mistral,
    "hermes": take_hermes,
    "qwen3_coder": take_qwen3_coder,
}
