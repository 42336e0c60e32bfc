"""An Anthropic Messages body as the chat-template input the OpenAI chat path renders.

`tool_use` blocks become the assistant message's `tool_calls`, `tool_result` blocks become
`tool` messages (in block order, between the user's text), system blocks one system message.
A `Cut` keeps the body only up to the end of one block, so that rendering the cut body shows
where that block ends in the prompt (cache breakpoints become branch hints there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..request.engine_request import InvalidRequestError
from .anthropic_schema import (
    CountTokensRequest,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

BLOCK_SEPARATOR = "\n"  # between text blocks of one message: a cut text stays a prefix


@dataclass(frozen=True)
class Cut:
    """The end of one block: ("tools", i), ("system", j) or ("messages", m, b)."""

    part: str
    index: int
    block: int = 0


@dataclass(frozen=True)
class ChatInput:
    """What render_chat takes."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


def chat_input(body: CountTokensRequest, cut: Cut | None = None) -> ChatInput:
    """The template input of `body`, or of its part up to the end of `cut`'s block."""
    tools = body.tools or []
    if cut is not None and cut.part == "tools":
        tools = tools[: cut.index + 1]
    messages = []
    # A tools cut keeps the whole system prompt: templates render the tools inside it.
    if body.system is not None:
        system_blocks = _system_texts(body.system)
        if cut is not None and cut.part == "system":
            system_blocks = system_blocks[: cut.index + 1]
        messages.append({"role": "system", "content": BLOCK_SEPARATOR.join(system_blocks)})
    if cut is None:
        sources = list(enumerate(body.messages))
    elif cut.part == "messages":
        sources = list(enumerate(body.messages[: cut.index + 1]))
    else:
        sources = []
    previous_calls: set[str] = set()
    for index, message in sources:
        blocks = _blocks(message)
        if cut is not None and cut.part == "messages" and index == cut.index:
            blocks = blocks[: cut.block + 1]
        messages += _converted(index, message.role, blocks, previous_calls)
        if message.role == "assistant":
            previous_calls = {b.id for b in blocks if isinstance(b, ToolUseBlock)}
    if not messages:  # a template needs a message: an empty user turn opens the first one
        messages.append({"role": "user", "content": ""})
    return ChatInput(messages, [openai_tool(tool) for tool in tools] or None)


def _system_texts(system: str | Sequence[TextBlock]) -> list[str]:
    return [system] if isinstance(system, str) else [block.text for block in system]


def _blocks(message: Message) -> list[Any]:
    if isinstance(message.content, str):
        return [TextBlock(type="text", text=message.content)]
    return list(message.content)


def openai_tool(tool: Any) -> dict[str, Any]:
    """Anthropic's tool as the OpenAI function tool that chat templates read."""
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _converted(
    index: int, role: str, blocks: list[Any], previous_calls: set[str]
) -> list[dict[str, Any]]:
    """One Anthropic message as template messages; InvalidRequestError names a bad block."""
    if role == "assistant":
        texts, calls = [], []
        for number, block in enumerate(blocks):
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolUseBlock):
                function = {"name": block.name, "arguments": block.input}
                calls.append({"id": block.id, "type": "function", "function": function})
            else:
                raise InvalidRequestError(
                    f"messages[{index}].content[{number}].type",
                    f"{block.type} blocks belong in user messages",
                )
        message: dict[str, Any] = {"role": "assistant", "content": BLOCK_SEPARATOR.join(texts)}
        if calls:
            message["tool_calls"] = calls
        return [message]
    out: list[dict[str, Any]] = []
    texts = []
    for number, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            if block.tool_use_id not in previous_calls:
                raise InvalidRequestError(
                    f"messages[{index}].content[{number}].tool_use_id",
                    f"{block.tool_use_id!r} answers no tool_use of the assistant message before",
                )
            if texts:
                out.append({"role": "user", "content": BLOCK_SEPARATOR.join(texts)})
                texts = []
            out.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": _result(block)}
            )
        else:
            raise InvalidRequestError(
                f"messages[{index}].content[{number}].type",
                f"{block.type} blocks belong in assistant messages",
            )
    if texts or not out:
        out.append({"role": "user", "content": BLOCK_SEPARATOR.join(texts)})
    return out


def _result(block: ToolResultBlock) -> str:
    if block.content is None:
        return ""
    if isinstance(block.content, str):
        return block.content
    return BLOCK_SEPARATOR.join(part.text for part in block.content)
