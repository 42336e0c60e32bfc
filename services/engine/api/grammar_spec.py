"""Grammars for constrained output: a JSON schema, or a tool call in a family's syntax.

The HTTP fronts (the engine's and the router's) turn `response_format`, a forcing `tool_choice`
and `strict` tools into one llguidance grammar (its Lark form, as text) that travels with the
request's sampling params; the engine builds each sample's token mask from it (grammar.py).
Every schema is checked here, so a bad one is a 400 naming the client's field.

JSON is written the way chat templates render it (Python's `json.dumps` spacing: `", "` and
`": "`, no other whitespace): that is what the model was trained to write, and it leaves a
model no room to loop on whitespace. A call is written as its family's parser reads it
(tool_parsers.py), with the name first and then the arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from ..request.engine_request import InvalidRequestError

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# The key each JSON family writes a call's arguments under.
ARGUMENTS_KEY = {"hermes": "arguments", "mistral": "arguments", "llama3_json": "parameters"}


@dataclass(frozen=True)
class ToolSpec:
    """One offered tool: its name, its arguments' schema (None: any object) and the client's
    field that holds that schema (named in errors)."""

    name: str
    schema: Mapping[str, Any] | None
    field: str


@dataclass(frozen=True)
class ToolMode:
    """What the request asks of calls: `forced` (a call must come; else text or calls),
    `only` (the one tool allowed), `parallel` (more than one call allowed)."""

    forced: bool
    only: str | None = None
    parallel: bool = True


def check_schema(schema: Any, field: str) -> dict[str, Any]:
    """`schema` as a JSON schema llguidance can compile; InvalidRequestError naming `field`."""
    if not isinstance(schema, Mapping):
        raise InvalidRequestError(field, "must be a JSON schema object")
    try:
        grammar = LLMatcher.grammar_from_json_schema(dict(schema), overrides=JSON_STYLE)
    except (ValueError, TypeError) as error:
        raise InvalidRequestError(field, f"not a usable JSON schema: {error}") from None
    problem = LLMatcher.validate_grammar(grammar)
    if problem:
        raise InvalidRequestError(field, f"not a usable JSON schema: {_first_line(problem)}")
    return dict(schema)


def json_grammar(schema: Any, field: str) -> str:
    """The grammar of a whole answer that is one JSON value valid against `schema`."""
    return LLMatcher.grammar_from_lark(f"start: {_json(check_schema(schema, field))}\n")


def tool_grammar(
    family: str, tools: Sequence[ToolSpec], mode: ToolMode, specials: Mapping[str, int]
) -> str:
    """The grammar of an answer whose calls are written in `family`'s syntax (see ToolMode).

    `specials`: the tokenizer's special tokens (text -> id); a marker that is one is matched
    as that token, never as its text."""
    if family not in FAMILY_RULES:
        raise ValueError(f"no grammar for tool-call family {family!r}")
    chosen = [tool for tool in tools if mode.only in (None, tool.name)]
    for tool in chosen:
        if tool.schema is not None:
            check_schema(tool.schema, tool.field)
    lines = FAMILY_RULES[family](chosen, mode, _Markers(specials))
    grammar = LLMatcher.grammar_from_lark("\n".join(lines) + "\n")
    problem = LLMatcher.validate_grammar(grammar)
    if problem:  # the schemas passed alone: what is left is a tool's name
        raise InvalidRequestError("tools", f"no call grammar: {_first_line(problem)}")
    return grammar


class _Markers:
    """Lark for a marker: its special token where the vocabulary has one, else its text."""

    def __init__(self, specials: Mapping[str, int]) -> None:
        self.specials = specials

    def __call__(self, text: str) -> str:
        token = self.specials.get(text)
        return f"<[{token}]>" if token is not None else _literal(text)

    def lead(self, text: str) -> list[str]:
        """Rules `plain` (text with no marker) and `lead` (any text, then the marker)."""
        token = self.specials.get(text)
        if token is not None:  # special tokens never occur inside text
            return ["plain: ANY_TEXT", f"lead: ANY_TEXT? <[{token}]>", "ANY_TEXT: /(?s:.+)/"]
        pattern = _regex_escape(text)
        return [
            "plain: PLAIN",
            f"PLAIN: /(?s:.*)/ & ~/(?s:.*{pattern}.*)/",
            f"lead[lazy]: /(?s:.*){pattern}/",
        ]


def _calls_top(mode: ToolMode, opener: str, separator: str, markers: _Markers) -> list[str]:
    """`start`, given rules `call` (marker included) and `body` (what follows the marker)."""
    more = f"({separator} call)*" if mode.parallel else ""
    if mode.forced:
        return [f"start: call {more}"]
    return [f"start: plain | lead body {more}", *markers.lead(opener)]


def _json_call(family: str, tool: ToolSpec) -> str:
    """One call object, `{"name": NAME, "arguments": {...}}`: the arguments are a `%json` of
    their own, so a schema's local `$ref`s still point where the client meant."""
    head = json.dumps({"name": tool.name})[:-1] + f', "{ARGUMENTS_KEY[family]}": '
    return f"{_literal(head)} {_arguments(tool)} {_literal('}')}"


def _alternatives(name: str, parts: list[str]) -> str:
    return f"{name}: " + " | ".join(parts)


def _hermes(tools: list[ToolSpec], mode: ToolMode, markers: _Markers) -> list[str]:
    # <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, calls one per line
    opener, closer = markers("<tool_call>"), markers("</tool_call>")
    return [
        *_calls_top(mode, "<tool_call>", '"\\n"', markers),
        f"call: {opener} body",
        f'body: "\\n" object "\\n" {closer}',
        _alternatives("object", [_json_call("hermes", t) for t in tools]),
    ]


def _llama3_json(tools: list[ToolSpec], mode: ToolMode, markers: _Markers) -> list[str]:
    # {"name": ..., "parameters": {...}} at the very start, calls separated by "; "
    more = '("; " call)*' if mode.parallel else ""
    lines = [
        f"start: call {more}" if mode.forced else f"start: PLAIN | call {more}",
        _alternatives("call", [_json_call("llama3_json", t) for t in tools]),
    ]
    if not mode.forced:  # text that does not start with "{" (the parser reads that as a call)
        lines.append("PLAIN: /(?s:\\s*([^{\\s].*)?)/")
    return lines


def _mistral(tools: list[ToolSpec], mode: ToolMode, markers: _Markers) -> list[str]:
    opener = markers("[TOOL_CALLS]")
    if "[ARGS]" in markers.specials:  # the newer form: [TOOL_CALLS]name[ARGS]{...} per call
        named = [f"{_literal(t.name)} {markers('[ARGS]')} {_arguments(t)}" for t in tools]
        return [
            *_calls_top(mode, "[TOOL_CALLS]", '""', markers),
            f"call: {opener} body",
            _alternatives("body", named),
        ]
    # [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
    more = '(", " object)*' if mode.parallel else ""
    return [
        *_calls_top(mode, "[TOOL_CALLS]", '""', markers),
        f"call: {opener} body",
        f'body: "[" object {more} "]"',
        _alternatives("object", [_json_call("mistral", t) for t in tools]),
    ]


def _qwen3_coder(tools: list[ToolSpec], mode: ToolMode, markers: _Markers) -> list[str]:
    # <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
    opener, closer = markers("<tool_call>"), markers("</tool_call>")
    lines = [
        *_calls_top(mode, "<tool_call>", '"\\n"', markers),
        f"call: {opener} body",
        f'body: "\\n" function "\\n" {closer}',
        _alternatives("function", [f"function{i}" for i in range(len(tools))]),
        f"text_value[lazy]: /(?s:.*){_regex_escape(chr(10) + '</parameter>')}/",
    ]
    for number, tool in enumerate(tools):
        params = _qwen3_parameters(tool, f"p{number}_")
        opener = _literal(f"<function={tool.name}>\n")
        lines.append(f'function{number}: {opener} {params[0]} "</function>"')
        lines += params[1:]
    return lines


def _qwen3_parameters(tool: ToolSpec, prefix: str) -> list[str]:
    """[the expression of the parameters in order, then their rules]: required ones once,
    optional ones at most once, each value as its declared type."""
    if tool.schema is None:  # any parameters, text values
        rule = f'{prefix}any: "<parameter=" /[A-Za-z0-9_.\\-]+/ ">\\n" text_value "\\n"'
        return [f"{prefix}any*", rule]
    properties = tool.schema.get("properties") or {}
    required = set(tool.schema.get("required") or ())
    parts, rules = [], []
    for index, (name, schema) in enumerate(properties.items()):
        rule = f"{prefix}{index}"
        schema = schema if isinstance(schema, Mapping) else {}
        if schema.get("type", "string") != "string":  # numbers, booleans, objects: JSON text
            value = f'{_json(schema)} "\\n</parameter>"'
        elif isinstance(schema.get("enum"), list):
            words = " | ".join(_literal(str(word)) for word in schema["enum"])
            value = f'({words}) "\\n</parameter>"'
        else:
            value = "text_value"
        opener = _literal(f"<parameter={name}>\n")
        rules.append(f'{rule}: {opener} {value} "\\n"')
        parts.append(rule if name in required else f"{rule}?")
    return [" ".join(parts) or '""', *rules]


def _arguments(tool: ToolSpec) -> str:
    return _json(tool.schema if tool.schema is not None else ANY_OBJECT)


def _json(schema: Mapping[str, Any]) -> str:
    """Lark's inline `%json` of `schema`, written in JSON_STYLE."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_STYLE})


def _literal(text: str) -> str:
    return json.dumps(text)


_REGEX_SPECIAL = set("\\.+*?()|[]{}^$#&-~")


def _regex_escape(text: str) -> str:
    """`text` as a Rust regex (inside Lark's /.../) matching it literally."""
    out = []
    for char in text:
        if char == "\n":
            out.append("\\n")
        elif char == "/":
            out.append("\\/")
        elif char in _REGEX_SPECIAL:
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message


FamilyRules = Callable[[list[ToolSpec], ToolMode, _Markers], list[str]]
FAMILY_RULES: dict[str, FamilyRules] = {
    "hermes": _hermes,
    "llama3_json": _llama3_json,
    "mistral": _mistral,
    "qwen3_coder": _qwen3_coder,
}
