"""OpenAI tool calling on /v1/chat/completions: checking `tools` and `tool_choice`, and
turning the model's text into `message.tool_calls` (whole) or `delta.tool_calls` (streamed).

The calls are parsed from the text (tool_calls.py). A `tool_choice` of "required" or a named
function, a tool with `strict: true` and a `response_format` of `json_schema` / `json_object`
constrain generation (`openai_ask`, constrained_output.py): the model can only write a call in
its family's syntax with arguments valid against the tool's schema, or the JSON asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..request.engine_request import InvalidRequestError
from ..request.sampling_params import TokenLogprob
from .constrained_output import OutputAsk, tool_spec
from .grammar_spec import ToolMode
from .openai_shapes import ResponseShape, sse_event
from .tool_calls import ContentDelta, Event, ToolCall, ToolCallStream, parse_tool_calls

TOOL_CHOICE_WORDS = ("none", "auto", "required")


def check_tools(tools: list[dict[str, Any]] | None) -> None:
    """InvalidRequestError naming the first bad field of `tools`."""
    for index, tool in enumerate(tools or ()):
        where = f"tools[{index}]"
        if tool.get("type", "function") != "function":
            raise InvalidRequestError(f"{where}.type", f'only "function", not {tool["type"]!r}')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidRequestError(f"{where}.function", "must be an object with a name")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"{where}.function.name", "must be a non-empty string")
        if not isinstance(function.get("parameters", {}), dict):
            raise InvalidRequestError(f"{where}.function.parameters", "must be a JSON object")


def check_tool_choice(tool_choice: str | dict[str, Any] | None, tools: list | None) -> None:
    """InvalidRequestError naming `tool_choice` when it is not one we can read against `tools`."""
    if tool_choice is None or tool_choice in ("none", "auto"):
        return
    if tool_choice == "required":
        if not tools:
            raise InvalidRequestError("tool_choice", '"required" needs tools')
        return
    if isinstance(tool_choice, str):
        raise InvalidRequestError("tool_choice", f"{tool_choice!r} not in {TOOL_CHOICE_WORDS}")
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if tool_choice.get("type") != "function" or not isinstance(name, str):
        raise InvalidRequestError(
            "tool_choice", 'must be a word or {"type": "function", "function": {"name": ...}}'
        )
    known = [t["function"]["name"] for t in tools or ()]
    if name not in known:
        raise InvalidRequestError("tool_choice", f"function {name!r} is not in tools {known}")


RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def openai_ask(
    tools: list | None,
    tool_choice: Any,
    response_format: dict[str, Any] | None,
    parallel_tool_calls: bool | None = None,
) -> OutputAsk:
    """What a chat (or completion: no tools) request asks of its output; InvalidRequestError
    names a bad `response_format` (tools and tool_choice are checked by check_tools and
    check_tool_choice)."""
    json_schema, json_field = _response_format(response_format)
    tools = tools or []
    parallel = parallel_tool_calls is not False
    only = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not tools or tool_choice == "none":
        mode = None
    elif tool_choice == "required" or only:
        mode = ToolMode(True, only, parallel and not only)
    elif any(_strict(tool) for tool in tools):
        mode = ToolMode(False, None, parallel)
    else:
        mode = None
    forced = mode is not None and mode.forced
    specs = [
        tool_spec(
            tool["function"]["name"],
            tool["function"].get("parameters"),
            f"tools[{index}].function.parameters",
            forced or _strict(tool),
        )
        for index, tool in enumerate(tools)
    ]
    choice_field = "tool_choice" if forced else "tools"
    return OutputAsk(specs, mode, choice_field, json_schema, json_field)


def _strict(tool: dict[str, Any]) -> bool:
    return tool["function"].get("strict") is True


def _response_format(response_format: dict[str, Any] | None) -> tuple[Any, str]:
    """(schema, field) of a JSON response format; (None, "") for text."""
    kind = (response_format or {}).get("type", "text")
    if kind not in RESPONSE_FORMATS:
        raise InvalidRequestError("response_format.type", f"{kind!r} not in {RESPONSE_FORMATS}")
    if kind == "text":
        return None, ""
    if kind == "json_object":
        return {"type": "object"}, "response_format"
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequestError("response_format.json_schema", "must be an object")
    schema = spec.get("schema", {})  # OpenAI: no schema is any JSON value
    return schema, "response_format.json_schema.schema"


def parsing_family(family: str | None, tools: list | None, tool_choice: Any) -> str | None:
    """The family to parse this request's output with; None: its text is returned as it is."""
    return family if family and tools and tool_choice != "none" else None


def calls_body(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


def with_tool_calls(response: dict[str, Any], family: str, tools: list) -> dict[str, Any]:
    """A whole chat response whose messages' calls are moved from `content` to `tool_calls`."""
    for choice in response["choices"]:
        message = choice["message"]
        content, calls = parse_tool_calls(message["content"], family, tools=tools)
        if calls:
            message["content"] = content or None
            message["tool_calls"] = calls_body(calls)
            choice["finish_reason"] = "tool_calls"
    return response


def delta_of(event: Event) -> dict[str, Any]:
    """The chat chunk `delta` of one parser event."""
    if isinstance(event, ContentDelta):
        return {"content": event.text}
    call: dict[str, Any] = {"index": event.index}
    if event.id is not None:  # the call's first delta: OpenAI sends id, type and name once
        call |= {"id": event.id, "type": "function"}
        function = {"name": event.name, "arguments": event.arguments}
    else:
        function = {"arguments": event.arguments}
    return {"tool_calls": [call | {"function": function}]}


class ToolChunks:
    """Streamed chat chunks of a request whose output is parsed for calls, one parser per
    sample; text that may start a call is held back by the parser."""

    def __init__(self, shape: ResponseShape, family: str, tools: list) -> None:
        self.shape, self.family, self.tools = shape, family, tools
        self._streams: dict[int, ToolCallStream] = {}

    def lines(
        self, index: int, text: str, reason: str | None, logprobs: tuple[TokenLogprob, ...]
    ) -> list[str]:
        stream = self._streams.setdefault(index, ToolCallStream(self.family, tools=self.tools))
        events = stream.feed(text) if text else []
        if reason:
            events += stream.finish()
        deltas = [delta_of(event) for event in events]
        if reason:
            deltas.append({})  # the finish reason rides on a chunk of its own
            reason = "tool_calls" if stream.calls else reason
        elif not deltas and logprobs:
            deltas.append({})  # the text is held, its logprobs are not
        lines = []
        for position, delta in enumerate(deltas):
            last = position == len(deltas) - 1
            lines.append(
                sse_event(
                    self.shape.chunk(
                        index, delta, reason if last else None, logprobs if position == 0 else ()
                    )
                )
            )
        return lines
