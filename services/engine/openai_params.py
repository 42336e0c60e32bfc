"""From a validated OpenAI body to a backend request: prompt, sampling, conversation, salt.

Parameters that would change what a client gets and that the engine does not do (tool calls,
structured output, logit bias, echo, suffix, best_of) are refused by name, never ignored.
"""

from __future__ import annotations

import uuid

from fastapi import Request

from .chat_template import render_chat
from .engine_request import InvalidRequestError
from .http_backends import BackendRequest, GenerateBackend
from .openai_schema import MAX_ID_CHARS, ChatCompletionRequest, CompletionRequest
from .request_inputs import make_sampling
from .tokenizer import stop_ids_of

CONVERSATION_HEADER = "x-conversation-id"
Body = CompletionRequest | ChatCompletionRequest


def refuse_unsupported(body: Body) -> None:
    """InvalidRequestError naming the first parameter the engine cannot honour."""
    # Tool definitions reach the model through its chat template, and its answer comes back as
    # text: a choice that demands a parsed tool call cannot be honoured.
    if body.tool_choice not in (None, "none", "auto"):
        raise InvalidRequestError(
            "tool_choice", 'tool calls are not parsed; only "auto" (text answers) or "none"'
        )
    if body.response_format and body.response_format.get("type", "text") != "text":
        kind = body.response_format.get("type")
        raise InvalidRequestError("response_format", f'only type "text" is supported, not {kind!r}')
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


def chat_prompt(body: ChatCompletionRequest, backend: GenerateBackend) -> list[int]:
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    for message in messages:  # OpenAI's newer name for the system role
        if message["role"] == "developer":
            message["role"] = "system"
    return render_chat(messages, backend.tokenizer, tools=body.tools)  # the template shows them


def top_logprobs(body: Body) -> int | None:
    """How many top alternatives per token (None: no logprobs at all)."""
    if isinstance(body, CompletionRequest):
        return body.logprobs
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequestError("top_logprobs", "needs logprobs: true")
    return (body.top_logprobs or 0) if body.logprobs else None


def backend_request(
    backend: GenerateBackend, request: Request, body: Body, prompt: list[int]
) -> BackendRequest:
    """The backend call for `body`; InvalidRequestError names the client's field."""
    refuse_unsupported(body)
    if body.model not in backend.model_names:
        raise InvalidRequestError(
            "model", f"unknown model {body.model!r}; known: {list(backend.model_names)}"
        )
    if not prompt:
        raise InvalidRequestError("prompt", "empty prompt")
    chat = isinstance(body, ChatCompletionRequest)
    max_tokens = body.max_completion_tokens if chat else None
    stop_ids = list(body.stop_token_ids or [])
    if not body.ignore_eos:
        stop_ids.extend(stop_ids_of(backend.tokenizer))  # every eos of generation_config
    sampling = make_sampling(
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        max_tokens=max_tokens if max_tokens is not None else body.max_tokens,
        stop_token_ids=stop_ids,
        stop=body.stop_strings(),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        logprobs=top_logprobs(body),
    )
    conversation = request.headers.get(CONVERSATION_HEADER) or body.conversation_id or body.user
    if conversation and len(conversation) > MAX_ID_CHARS:
        raise InvalidRequestError(
            "X-Conversation-Id", f"{len(conversation)} chars > limit {MAX_ID_CHARS}"
        )
    return BackendRequest(
        request_id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        prompt_token_ids=tuple(prompt),
        sampling=sampling,
        conversation_id=str(conversation) if conversation else None,
        num_samples=body.n,
        cache_salt=body.cache_salt or "",
    )
