"""OpenAI tool calling on /v1/chat/completions: checking `tools` and `tool_choice`, and
turning the model's text into `message.tool_calls` (whole) or `delta.tool_calls` (streamed).

The calls are parsed from the text (tool_calls.py); generation is not constrained, so a
`tool_choice` of "required" or a named function is honoured only as far as the model follows
the prompt: when it answers without a call, the answer comes back as text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .engine_request import InvalidRequestError
from .openai_shapes import ResponseShape, sse_event
from .sampling_params import TokenLogprob
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
