"""Anthropic `cache_control` breakpoints: Anthropic's rules, and their token positions.

A breakpoint marks a block (a tool, a system block, a message block; the top-level
`cache_control` marks the last block of the last message). Anthropic's rules, kept here: at
most 4 breakpoints, and a `1h` breakpoint never after a `5m` one in prompt order (tools,
system, messages). Each breakpoint becomes a branch hint where the marked block ends in the
rendered prompt: a later turn that keeps the prefix up to it (a context reset, a rewritten
tail) resumes there, on models whose window or state layers need a kept resume point.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..request.engine_request import InvalidRequestError
from .anthropic_chat import ChatInput, Cut
from .anthropic_schema import TTL_SECONDS, CacheControl, CountTokensRequest, ToolResultBlock

MAX_BREAKPOINTS = 4
LONG_TTL_SECONDS = TTL_SECONDS["1h"]


@dataclass(frozen=True)
class Breakpoint:
    field: str  # where the client set it, for errors: `messages[2].content[0].cache_control`
    cut: Cut
    ttl_seconds: int


def breakpoints_of(body: CountTokensRequest) -> list[Breakpoint]:
    """The body's breakpoints in prompt order; InvalidRequestError for Anthropic's rules."""
    found: list[Breakpoint] = []

    def add(control: CacheControl | None, field: str, cut: Cut) -> None:
        if control is not None:
            found.append(Breakpoint(field, cut, control.seconds))

    for index, tool in enumerate(body.tools or []):
        add(tool.cache_control, f"tools[{index}].cache_control", Cut("tools", index))
    if isinstance(body.system, list):
        for index, block in enumerate(body.system):
            add(block.cache_control, f"system[{index}].cache_control", Cut("system", index))
    for index, message in enumerate(body.messages):
        if isinstance(message.content, str):
            continue
        for number, block in enumerate(message.content):
            field, cut = f"messages[{index}].content[{number}]", Cut("messages", index, number)
            add(block.cache_control, f"{field}.cache_control", cut)
            if isinstance(block, ToolResultBlock) and isinstance(block.content, list):
                for part, text in enumerate(block.content):
                    add(text.cache_control, f"{field}.content[{part}].cache_control", cut)
    if body.cache_control is not None:  # automatic caching: the last block of the last message
        last = body.messages[-1].content
        end = 0 if isinstance(last, str) else max(0, len(last) - 1)
        add(body.cache_control, "cache_control", Cut("messages", len(body.messages) - 1, end))
    _check_rules(found)
    return found


def _check_rules(found: Sequence[Breakpoint]) -> None:
    if len(found) > MAX_BREAKPOINTS:
        raise InvalidRequestError(
            found[MAX_BREAKPOINTS].field,
            f"{len(found)} cache_control breakpoints; at most {MAX_BREAKPOINTS} are allowed",
        )
    first_short = next((p for p in found if p.ttl_seconds < LONG_TTL_SECONDS), None)
    for point in found[found.index(first_short) + 1 :] if first_short else ():
        if point.ttl_seconds >= LONG_TTL_SECONDS:
            raise InvalidRequestError(
                f"{point.field}.ttl",
                f'a "1h" cache_control must not come after a "5m" one ({first_short.field})',
            )


def token_position(
    render: Callable[[ChatInput], list[int]], cut_input: ChatInput, prompt: Sequence[int]
) -> int:
    """Where the cut body's rendering stops agreeing with the prompt: the end of the marked
    block (a template's end-of-message tokens after it count too when the prompt has them)."""
    try:
        head = render(cut_input)
    except InvalidRequestError:
        return 0  # a template that refuses the cut body (say, no user turn yet): no position
    same = 0
    for mine, theirs in zip(head, prompt, strict=False):
        if mine != theirs:
            break
        same += 1
    return same


def system_end_cut(body: CountTokensRequest) -> Cut | None:
    """Without breakpoints, where the system prompt (and the tools) ends: a context reset
    keeps them, so a later turn branches there (the OpenAI chat path's derived hint)."""
    if isinstance(body.system, str) or (isinstance(body.system, list) and body.system):
        count = 1 if isinstance(body.system, str) else len(body.system)
        return Cut("system", count - 1)
    if body.tools:
        return Cut("tools", len(body.tools) - 1)
    return None
