"""From a validated Anthropic Messages body to a backend request: prompt, sampling, identity,
branch hints from its cache breakpoints.

The prompt is the model's chat template over the converted body (anthropic_chat.py), as on the
OpenAI chat path. `tool_choice` `any` / `tool`, tools with `strict` and `output_config.format`
become the request's output grammar (constrained_output.py). What the engine cannot honour is
refused by name: `top_k` other than 1 while sampling.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from fastapi import Request

from ..model.tokenizer import stop_ids_of
from ..request.engine_request import InvalidRequestError
from ..request.request_inputs import MAX_BRANCH_HINTS, make_sampling
from .anthropic_cache import Breakpoint, breakpoints_of, system_end_cut, token_position
from .anthropic_chat import ChatInput, chat_input
from .anthropic_schema import CountTokensRequest, MessagesRequest
from .chat_template import render_chat
from .constrained_output import OutputAsk, output_grammar, tool_spec
from .grammar_spec import ToolMode
from .http_backends import BackendRequest, GenerateBackend
from .session_identity import PrefixParts, conversation_of


class ModelNotFoundError(InvalidRequestError):
    """The body names a model this fleet does not serve (Anthropic answers 404)."""


@dataclass(frozen=True)
class PreparedMessages:
    """A Messages request ready for the backend, and what its usage report needs."""

    call: BackendRequest
    breakpoints: tuple[tuple[int, int], ...]  # (token position, TTL seconds), prompt order


def render(backend: GenerateBackend, chat: ChatInput, generation_prompt: bool = True) -> list[int]:
    return render_chat(chat.messages, backend.tokenizer, chat.tools, generation_prompt)


def check_model(body: CountTokensRequest, backend: GenerateBackend) -> None:
    if body.model not in backend.model_names:
        raise ModelNotFoundError(
            "model", f"unknown model {body.model!r}; served: {list(backend.model_names)}"
        )


def messages_prompt(body: CountTokensRequest, backend: GenerateBackend) -> list[int]:
    """The prompt's token ids (also what count_tokens counts)."""
    check_model(body, backend)
    return render(backend, chat_input(body))


def breakpoint_positions(
    body: CountTokensRequest,
    backend: GenerateBackend,
    prompt: list[int],
    breakpoints: list[Breakpoint],
) -> tuple[tuple[int, int], ...]:
    """(position, TTL seconds) of each breakpoint inside the prompt, else of the system end."""
    cuts = [(point.cut, point.ttl_seconds) for point in breakpoints]
    if not cuts and (cut := system_end_cut(body)) is not None:
        cuts = [(cut, 0)]  # a derived hint, not a client breakpoint: no TTL of its own

    def rendered(chat: ChatInput) -> list[int]:
        return render(backend, chat, generation_prompt=False)

    positions = []
    for cut, ttl in cuts:
        position = token_position(rendered, chat_input(body, cut), prompt)
        if 0 < position < len(prompt):  # the whole prompt is no branch point: it is the end
            positions.append((position, ttl))
    return tuple(positions)


def sampling_of(body: MessagesRequest, backend: GenerateBackend, grammar: str = ""):
    temperature = body.temperature
    if body.top_k == 1:
        temperature = 0.0  # top_k 1 is greedy
    elif body.top_k and temperature != 0:
        raise InvalidRequestError(
            "top_k", "not supported: only 1 (greedy), or any value with temperature 0"
        )
    return make_sampling(
        temperature=temperature,
        top_p=body.top_p,
        seed=None,
        max_tokens=body.max_tokens,
        stop_token_ids=stop_ids_of(backend.tokenizer),
        stop=body.stop_sequences or (),
        grammar=grammar,
    )


def messages_ask(body: MessagesRequest) -> OutputAsk:
    """What the body asks of its output: a forced call (`tool_choice` any / tool), strict
    calls, or a JSON answer (`output_config.format`)."""
    choice, tools = body.tool_choice, body.tools or []
    kind = choice.type if choice is not None else "auto"
    parallel = not (choice is not None and choice.disable_parallel_tool_use)
    names = [tool.name for tool in tools]
    if kind in ("any", "tool") and not tools:
        raise InvalidRequestError("tool_choice.type", f"{kind!r} needs tools")
    if kind == "tool" and choice.name not in names:
        raise InvalidRequestError("tool_choice.name", f"{choice.name!r} is not in tools {names}")
    strict = any(tool.strict for tool in tools)
    if kind in ("any", "tool"):
        mode = ToolMode(True, choice.name if kind == "tool" else None, parallel and kind == "any")
    else:
        mode = ToolMode(False, None, parallel) if strict and kind == "auto" else None
    forced = mode is not None and mode.forced
    specs = [
        tool_spec(
            tool.name,
            tool.input_schema,
            f"tools[{index}].input_schema",
            forced or bool(tool.strict),
        )
        for index, tool in enumerate(tools)
    ]
    output = body.output_config.format if body.output_config else None
    return OutputAsk(
        specs,
        mode,
        "tool_choice" if forced else "tools",
        output.schema_ if output else None,
        "output_config.format.schema" if output else "",
    )


def opening_of(body: CountTokensRequest) -> PrefixParts:
    """Tools, system and first user message without their cache_control markers (harnesses
    move the markers from turn to turn; the prefix identity must not move with them)."""

    def plain(value):
        if isinstance(value, list):
            return [plain(item) for item in value]
        if hasattr(value, "model_dump"):
            return value.model_dump(exclude={"cache_control"}, exclude_none=True)
        return value

    first_user = next((m.content for m in body.messages if m.role == "user"), None)
    user_id = body.metadata.user_id if isinstance(body, MessagesRequest) and body.metadata else None
    return PrefixParts(plain(body.tools), plain(body.system), plain(first_user), user_id)


def prepare(
    body: MessagesRequest,
    backend: GenerateBackend,
    request: Request,
    tool_family: str | None = None,
) -> PreparedMessages:
    """The backend call for `body`; InvalidRequestError names the client's field.
    `tool_family`: the model's tool-call syntax, which a forced or strict call is written in."""
    grammar = output_grammar(messages_ask(body), tool_family, backend.tokenizer)
    breakpoints = breakpoints_of(body)  # the rules first: they need no rendering
    prompt = messages_prompt(body, backend)
    positions = breakpoint_positions(body, backend, prompt, breakpoints)
    hints = tuple(sorted({position for position, _ttl in positions}))[:MAX_BRANCH_HINTS]
    user_id = body.metadata.user_id if body.metadata else None
    conversation = conversation_of(
        request.headers, anthropic_user_id=user_id, prefix=opening_of(body)
    )
    call = BackendRequest(
        request_id=f"msg_{uuid.uuid4().hex}",
        prompt_token_ids=tuple(prompt),
        sampling=sampling_of(body, backend, grammar),
        conversation_id=conversation,
        branch_hints=hints,
        retention_seconds=max((point.ttl_seconds for point in breakpoints), default=0),
    )
    return PreparedMessages(call, tuple(p for p in positions if p[1] > 0))
