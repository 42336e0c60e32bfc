"""A simple chat template: role marker, content, newline; then the assistant marker.

Each message renders on its own, so turn n+1's prompt starts with turn n's prompt token for
token (the prefix cache and the router's affinity depend on that). Role markers are the
tokenizer's special tokens when it has them (`<|user|>`, `<|assistant|>`), else `role: `.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .engine_request import InvalidRequestError
from .tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")


def _marker(role: str, tokenizer: Tokenizer) -> list[int]:
    special = getattr(tokenizer, "special_ids", {}).get(f"<|{role}|>")
    return [special] if special is not None else tokenizer.encode(f"{role}: ")


def render_chat(messages: Sequence[Mapping[str, object]], tokenizer: Tokenizer) -> list[int]:
    """Prompt token ids for `messages`, ending with the assistant marker."""
    if not messages:
        raise InvalidRequestError("messages", "empty: at least one message is needed")
    ids: list[int] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequestError(f"messages[{index}].role", f"{role!r} not in {ROLES}")
        ids += _marker(str(role), tokenizer) + tokenizer.encode(f"{_text(message, index)}\n")
    return ids + _marker("assistant", tokenizer)


def _text(message: Mapping[str, object], index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    raise InvalidRequestError(f"messages[{index}].content", f"type {type(content).__name__}")
