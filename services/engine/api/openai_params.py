"""From a validated OpenAI body to a backend request: prompt, sampling, conversation, salt.

Parameters that would change what a client gets and that the engine does not do (logit bias,
echo, suffix, best_of) are refused by name, never ignored. Tools and `tool_choice` are checked
here (openai_tools.py) and parsed from the answer; a forcing `tool_choice`, `strict` tools and
a JSON `response_format` become the request's output grammar (constrained_output.py).
"""

from __future__ import annotations

import uuid

from fastapi import Request

from ..model.tokenizer import stop_ids_of
from ..request.engine_request import InvalidRequestError
from ..request.request_inputs import branch_hints_of, make_sampling
from .chat_template import render_chat
from .constrained_output import output_grammar
from .http_backends import BackendRequest, GenerateBackend
from .openai_schema import ChatCompletionRequest, CompletionRequest
from .openai_tools import check_tool_choice, check_tools, openai_ask
from .session_identity import PrefixParts, conversation_of

Body = CompletionRequest | ChatCompletionRequest


def refuse_unsupported(body: Body) -> None:
    """InvalidRequestError naming the first parameter the engine cannot honour."""
    # Tool definitions reach the model through its chat template; its calls are parsed from
    # its answer (openai_tools.py), so only the request's own shape can be wrong here.
    check_tools(body.tools)
    check_tool_choice(body.tool_choice, body.tools)
    if body.logit_bias:
        raise InvalidRequestError("logit_bias", "not supported")
    if isinstance(body, CompletionRequest):
        if body.echo:
            raise InvalidRequestError("echo", "not supported")
        if body.suffix:
            raise InvalidRequestError("suffix", "not supported")
        if body.best_of is not None and body.best_of != body.n:
            raise InvalidRequestError("best_of", "not supported (leave it unset or equal to n)")


def completion_prompt(body: CompletionRequest, backend: GenerateBackend) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return backend.tokenizer.encode(prompt)
    return list(prompt)


# OpenAI's `prompt_cache_retention`: in memory keeps a prefix a few minutes after its last use
# (Anthropic's default 5 minutes here), `24h` a day.
RETENTION_SECONDS = {"in_memory": 300, "24h": 24 * 3600}
SYSTEM_ROLES = ("system", "developer")  # developer: OpenAI's newer name for the system role


def chat_messages(body: ChatCompletionRequest, count: int | None = None) -> list[dict]:
    """The first `count` messages (None: all) as template input, developer read as system."""
    messages = [m.model_dump(exclude_none=True) for m in body.messages[:count]]
    for message in messages:
        if message["role"] in SYSTEM_ROLES:
            message["role"] = "system"
    return messages


def chat_prompt(body: ChatCompletionRequest, backend: GenerateBackend) -> list[int]:
    # Before rendering: a template reading a bad tool would fail with a message naming no field.
    check_tools(body.tools)
    check_tool_choice(body.tool_choice, body.tools)
    return render_chat(chat_messages(body), backend.tokenizer, tools=body.tools)  # shows tools


def system_end_hint(
    body: ChatCompletionRequest, backend: GenerateBackend, prompt: list[int]
) -> tuple[int, ...]:
    """Where the leading system messages (and the tools the template renders with them) end in
    `prompt`: a context reset keeps them and rewrites the rest, so a later turn branches there.
    None when no other message follows them, or the template renders them differently alone."""
    # NOTE: only the leading messages are dumped again; chat_prompt dumped the whole history.
    roles = [message.role for message in body.messages]
    leading = next((i for i, role in enumerate(roles) if role not in SYSTEM_ROLES), len(roles))
    if leading == 0 or leading == len(roles):
        return ()
    head = render_chat(
        chat_messages(body, leading), backend.tokenizer, body.tools, add_generation_prompt=False
    )
    return (len(head),) if 0 < len(head) < len(prompt) and prompt[: len(head)] == head else ()


def chat_opening(body: ChatCompletionRequest) -> PrefixParts:
    """What every turn of this chat resends unchanged: tools, system messages, first user
    message (the prefix identity when the client names no conversation)."""
    system = [_plain(m.content) for m in body.messages if m.role in SYSTEM_ROLES]
    first_user = next((_plain(m.content) for m in body.messages if m.role == "user"), None)
    tenant = f"{body.user or ''}|{body.cache_salt or ''}"
    return PrefixParts(body.tools, system, first_user, tenant)


def _plain(content: object) -> object:
    """Message content as JSON values (text parts are models)."""
    return [p.model_dump() for p in content] if isinstance(content, list) else content


def top_logprobs(body: Body) -> int | None:
    """How many top alternatives per token (None: no logprobs at all)."""
    if isinstance(body, CompletionRequest):
        return body.logprobs
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequestError("top_logprobs", "needs logprobs: true")
    return (body.top_logprobs or 0) if body.logprobs else None


def context_room(backend: GenerateBackend, prompt: list[int]) -> int | None:
    """A chat's default `max_tokens`: what the context leaves after the prompt, so a reply runs
    to its end (OpenAI's chat semantics). The context is the backend's longest request (the
    model's, or less where the KV pools hold less). None where the backend does not know it (a
    router front started without the model card): the legacy default of 16 applies."""
    context = backend.max_request_tokens
    if context is None:
        return None
    if len(prompt) >= context:
        raise InvalidRequestError(
            "prompt", f"{len(prompt)} tokens leave no room in the model's context of {context}"
        )
    return context - len(prompt)


def request_grammar(body: Body, backend: GenerateBackend, tool_family: str | None) -> str:
    """The output grammar `body` asks for ("" when none); InvalidRequestError names the field."""
    if isinstance(body, CompletionRequest):
        ask = openai_ask(None, None, body.response_format)
    else:
        choice, parallel = body.tool_choice, body.parallel_tool_calls
        ask = openai_ask(body.tools, choice, body.response_format, parallel)
    return output_grammar(ask, tool_family, backend.tokenizer)


def backend_request(
    backend: GenerateBackend,
    request: Request,
    body: Body,
    prompt: list[int],
    tool_family: str | None = None,
) -> BackendRequest:
    """The backend call for `body`; InvalidRequestError names the client's field.
    `tool_family`: the model's tool-call syntax, which a forced or strict call is written in."""
    refuse_unsupported(body)
    grammar = request_grammar(body, backend, tool_family)
    if body.model not in backend.model_names:
        raise InvalidRequestError(
            "model", f"unknown model {body.model!r}; known: {list(backend.model_names)}"
        )
    if not prompt:
        raise InvalidRequestError("prompt", "empty prompt")
    chat = isinstance(body, ChatCompletionRequest)
    max_tokens = body.max_completion_tokens if chat else None
    if max_tokens is None:
        max_tokens = body.max_tokens
    if max_tokens is None and chat:
        max_tokens = context_room(backend, prompt)
    stop_ids = list(body.stop_token_ids or [])
    if not body.ignore_eos:
        stop_ids.extend(stop_ids_of(backend.tokenizer))  # every eos of generation_config
    sampling = make_sampling(
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        max_tokens=max_tokens,
        stop_token_ids=stop_ids,
        stop=body.stop_strings(),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        logprobs=top_logprobs(body),
        grammar=grammar,
    )
    conversation = conversation_of(
        request.headers,
        prompt_cache_key=body.prompt_cache_key,
        conversation_id=body.conversation_id,
        prefix=chat_opening(body) if chat else None,
    )
    if body.branch_hints is not None:
        hints = branch_hints_of(body.branch_hints, len(prompt))
    else:
        hints = system_end_hint(body, backend, prompt) if chat else ()
    return BackendRequest(
        request_id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        prompt_token_ids=tuple(prompt),
        sampling=sampling,
        conversation_id=str(conversation) if conversation else None,
        num_samples=body.n,
        cache_salt=body.cache_salt or "",
        branch_hints=hints,
        retention_seconds=RETENTION_SECONDS.get(body.prompt_cache_retention or "", 0),
    )
