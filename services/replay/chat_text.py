"""A synthesised prompt as the text of a chat: tools, a system prompt and user messages.

Each token id becomes one letter or digit, so a byte-level tokenizer reads back exactly one
token per id and subword tokenizers still keep equal prefixes equal (no spaces, no markup a
template or tokenizer could take for a special token). The chat API and the Messages API
targets send the same `ChatText`, so their reuse is comparable: the server renders both through
the same chat template.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from itertools import pairwise

from .prompt_layout import PromptLayout

ALPHABET = string.ascii_letters + string.digits
TOOL_NAME = "replayed_tools"  # the trace's tools, one tool whose description holds them all
EMPTY_SCHEMA = {"type": "object"}


def token_text(tokens: list[int]) -> str:
    """One character per token id."""
    size = len(ALPHABET)
    return "".join(ALPHABET[token % size] for token in tokens)


@dataclass(frozen=True)
class ChatText:
    tools: str  # "" when the prompt has no tools part
    system: str  # "" when it has no system part
    messages: tuple[str, ...]  # user messages, at least one

    def tool_function(self) -> dict:
        """The tools part as one OpenAI function tool, keys in the order the Messages API
        converts Anthropic tools to (a template's `tojson` renders them in this order)."""
        function = {"name": TOOL_NAME, "parameters": EMPTY_SCHEMA, "description": self.tools}
        return {"type": "function", "function": function}


def chat_text(tokens: list[int], layout: PromptLayout | None) -> ChatText:
    """`tokens` cut where `layout` says (no layout: one user message)."""
    if layout is None:
        return ChatText("", "", (token_text(tokens),))
    starts = [layout.system_end, *layout.message_starts, len(tokens)]
    messages = tuple(token_text(tokens[a:b]) for a, b in pairwise(starts) if b > a)
    return ChatText(
        token_text(tokens[: layout.tools_end]),
        token_text(tokens[layout.tools_end : layout.system_end]),
        messages or ("",),  # a prompt that is all tools and system still needs a user turn
    )
