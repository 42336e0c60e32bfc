"""Chat prompts: the model's own Jinja chat template, rendered the way transformers renders it,
or (for tokenizers without one, like the byte tokenizer) a simple built-in format.

transformers' `apply_chat_template` renders with an ImmutableSandboxedEnvironment
(trim_blocks, lstrip_blocks, loopcontrols), a `tojson` that keeps non-ASCII and takes
indent/separators/sort_keys, `raise_exception`, `strftime_now`, and passes `messages`,
`tools`, `documents`, `add_generation_prompt` and the special tokens (`bos_token`, ...);
the text is then tokenized without adding special tokens (the template writes them).

The built-in format renders each message on its own: role marker, content, newline; then the
assistant marker. So turn n+1's prompt starts with turn n's prompt token for token (the prefix
cache and the router's affinity depend on that). Role markers are the tokenizer's special
tokens when it has them (`<|user|>`, `<|assistant|>`), else `role: `.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from ..model.tokenizer import Tokenizer
from ..request.engine_request import InvalidRequestError

ROLES = ("system", "user", "assistant", "tool")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render_chat(
    messages: Sequence[Mapping[str, object]],
    tokenizer: Tokenizer,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Prompt token ids for `messages` (and `tools`, which only a model's template renders)."""
    if not messages:
        raise InvalidRequestError("messages", "empty: at least one message is needed")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"messages[{index}]", "must be an object {role, content}")
    template = getattr(tokenizer, "chat_template", None)
    if template:
        text = render_template(
            template,
            messages,
            tools,
            add_generation_prompt,
            getattr(tokenizer, "special_tokens", {}),
        )
        return tokenizer.encode(text)
    return _render_builtin(messages, tokenizer, add_generation_prompt)


def render_template(
    template: str,
    messages: Sequence[Mapping[str, object]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
) -> str:
    """The text `template` renders for this conversation (what apply_chat_template renders)."""
    import jinja2

    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise InvalidRequestError("tools", "must be a list of tool objects")
    try:
        return _compile(template).render(
            **dict(special_tokens or {}),
            messages=[_alias_reasoning(dict(m)) for m in messages],
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
        )
    except jinja2.TemplateError as error:
        raise InvalidRequestError("messages", f"the chat template refused them: {error}") from None


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    # As transformers does: older names of the reasoning field fill `reasoning_content` (and
    # `thinking`, which gpt-oss templates read).
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


@lru_cache(maxsize=8)
def _compile(template: str):
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        # `{% generation %}...{% endgeneration %}` marks assistant text for training masks;
        # rendering keeps the body as it is.
        tags = {"generation"}  # noqa: RUF012 (jinja reads the class attribute)

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _marker(role: str, tokenizer: Tokenizer) -> list[int]:
    special = getattr(tokenizer, "special_ids", {}).get(f"<|{role}|>")
    return [special] if special is not None else tokenizer.encode(f"{role}: ")


def _render_builtin(
    messages: Sequence[Mapping[str, object]], tokenizer: Tokenizer, add_generation_prompt: bool
) -> list[int]:
    ids: list[int] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequestError(f"messages[{index}].role", f"{role!r} not in {ROLES}")
        ids += _marker(str(role), tokenizer) + tokenizer.encode(f"{_text(message, index)}\n")
    return ids + (_marker("assistant", tokenizer) if add_generation_prompt else [])


def _text(message: Mapping[str, object], index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    raise InvalidRequestError(f"messages[{index}].content", f"type {type(content).__name__}")
