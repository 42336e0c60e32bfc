"""One request's output grammar from what both APIs ask for in their own words: a forced or
strict tool call, or a JSON answer (the OpenAI and Anthropic fronts translate into these).

A grammar needs the model's tool-call syntax (`family`) to force a call; without one the
request is refused naming the client's field, never answered unconstrained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..model.tokenizer import Tokenizer
from ..request.engine_request import InvalidRequestError
from .grammar_spec import ToolMode, ToolSpec, check_schema, json_grammar, tool_grammar

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class OutputAsk:
    """What the client asked of the output: calls (`tools` and `mode`; the field `choice_field`
    forced them) and/or a JSON answer (`json_schema`, from `json_field`)."""

    tools: Sequence[ToolSpec] = ()
    mode: ToolMode | None = None
    choice_field: str = "tool_choice"
    json_schema: Any = None
    json_field: str = ""


def output_grammar(ask: OutputAsk, family: str | None, tokenizer: Tokenizer) -> str:
    """The llguidance grammar for `ask` ("" when it constrains nothing)."""
    if ask.json_field and ask.mode is not None:
        combined = f"cannot be combined with constrained calls ({ask.choice_field})"
        raise InvalidRequestError(ask.json_field, f"a JSON answer {combined}")
    if ask.json_field:
        return json_grammar(ask.json_schema, ask.json_field)
    if ask.mode is None:
        return ""
    if family is None:
        for tool in ask.tools:  # the client's schemas first: a bad one is theirs to fix
            if tool.schema is not None:
                check_schema(tool.schema, tool.field)
        raise InvalidRequestError(
            ask.choice_field,
            "the model's tool-call syntax is unknown, so calls cannot be constrained "
            "(serve it with --tool-call-parser FAMILY)",
        )
    specials = getattr(tokenizer, "special_token_ids", None) or {}
    return tool_grammar(family, ask.tools, ask.mode, specials)


def tool_spec(name: str, schema: Any, field: str, constrained: bool) -> ToolSpec:
    """A tool whose arguments are held to `schema` when `constrained` (else any object)."""
    if not constrained:
        return ToolSpec(name, None, field)
    return ToolSpec(name, EMPTY_PARAMETERS if schema is None else schema, field)
