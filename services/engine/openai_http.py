"""The OpenAI-compatible HTTP API over a generate backend (an engine core, or the router).

Endpoints: `/v1/completions`, `/v1/chat/completions` (SSE with `stream: true`), `/v1/models`,
`/health`. The conversation id (for the prefix cache's retention and the router's pins) comes
from the `X-Conversation-Id` header, else the body's `conversation_id`. Usage reports reused
prompt tokens in `prompt_tokens_details.cached_tokens`, plus the engine's `ttft_seconds` and
`mean_itl_seconds`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .chat_template import render_chat
from .detokenizer import StreamDetokenizer
from .engine_request import EngineStoppedError, InvalidRequestError, SampleOutput, Usage
from .http_backends import BackendRequest, GenerateBackend
from .request_inputs import make_sampling
from .tokenizer import stop_ids_of

CONVERSATION_HEADER = "x-conversation-id"


def build_app(backend: GenerateBackend) -> FastAPI:
    """The FastAPI app; mount it on an engine rank or in front of the router."""
    app = FastAPI(title="kvfleet", docs_url=None, redoc_url=None)

    @app.exception_handler(InvalidRequestError)
    async def invalid(_request: Request, error: InvalidRequestError) -> JSONResponse:
        return _error(400, str(error), error.field, "invalid_request_error")

    @app.exception_handler(EngineStoppedError)
    async def unavailable(_request: Request, error: EngineStoppedError) -> JSONResponse:
        return _error(503, str(error), None, "service_unavailable")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [{"id": n, "object": "model", "owned_by": "kvfleet"} for n in backend.model_names]
        return {"object": "list", "data": data}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await json_body(request)
        prompt = _completion_prompt(body.get("prompt"), backend)
        return await _respond(backend, request, body, prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await json_body(request)
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise InvalidRequestError("messages", "must be a list of {role, content}")
        prompt = render_chat(messages, backend.tokenizer, tools=body.get("tools"))
        return await _respond(backend, request, body, prompt, chat=True)

    return app


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object; InvalidRequestError naming `body` otherwise."""
    try:
        body = await request.json()
    except ValueError as error:
        raise InvalidRequestError("body", f"not JSON: {error}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    return body


def _completion_prompt(prompt: Any, backend: GenerateBackend) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return backend.tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    raise InvalidRequestError("prompt", "must be a string or a list of token ids")


def _backend_request(
    backend: GenerateBackend, request: Request, body: dict[str, Any], prompt: list[int]
) -> BackendRequest:
    model = body.get("model")
    if model not in backend.model_names:
        raise InvalidRequestError("model", f"unknown model {model!r}; known: {backend.model_names}")
    if not prompt:
        raise InvalidRequestError("prompt", "empty prompt")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    stop_ids = list(body.get("stop_token_ids") or [])
    if not body.get("ignore_eos"):
        stop_ids.extend(stop_ids_of(backend.tokenizer))  # every eos of generation_config
    n = body.get("n", 1)
    if not isinstance(n, int) or n < 1:
        raise InvalidRequestError("n", f"{n!r} must be an integer >= 1")
    try:
        sampling = make_sampling(
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            seed=body.get("seed"),
            max_tokens=max_tokens,
            stop_token_ids=stop_ids,
        )
    except (TypeError, ValueError) as error:
        if isinstance(error, InvalidRequestError):
            raise
        raise InvalidRequestError("sampling", str(error)) from None
    conversation = request.headers.get(CONVERSATION_HEADER) or body.get("conversation_id")
    return BackendRequest(
        request_id=f"{'chatcmpl' if 'messages' in body else 'cmpl'}-{uuid.uuid4().hex}",
        prompt_token_ids=tuple(prompt),
        sampling=sampling,
        conversation_id=str(conversation) if conversation else None,
        num_samples=n,
    )


async def _respond(
    backend: GenerateBackend, request: Request, body: dict[str, Any], prompt: list[int], chat: bool
):
    call = _backend_request(backend, request, body, prompt)
    stream = backend.generate(call)
    # Pull the first output before answering, so bad input is a 400, not a broken stream.
    first = await anext(stream, None)
    shape = _Shape(call.request_id, str(body.get("model")), chat, backend)
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            _sse(shape, first, stream, include_usage, call.num_samples, request),
            media_type="text/event-stream",
        )
    outputs = [first] if first is not None else []
    outputs += [output async for output in stream]
    return shape.full(outputs, call.num_samples)


async def _sse(
    shape: _Shape,
    first: SampleOutput | None,
    rest: AsyncIterator[SampleOutput],
    include_usage: bool,
    num_samples: int,
    request: Request,
) -> AsyncIterator[str]:
    usages: dict[int, Usage] = {}
    detokenizer = StreamDetokenizer(shape.backend.tokenizer)

    def event(output: SampleOutput) -> str:
        if output.usage is not None:
            usages[output.sample_index] = output.usage
        text = detokenizer.piece(output.sample_index, output.token_ids, output.finished)
        piece = {"content": text} if shape.chat else text
        return _event(shape.chunk(output.sample_index, piece, output.finish_reason or None))

    try:
        if shape.chat:
            for index in range(num_samples):
                yield _event(shape.chunk(index, {"role": "assistant", "content": ""}, None))
        if first is not None:
            yield event(first)
        async for output in rest:
            # NOTE: ask the server between tokens: whether a write to a closed socket raises
            # depends on the server, and a stream nobody reads must not hold its pages.
            if await request.is_disconnected():
                return
            yield event(output)
        if include_usage:
            yield _event({**shape.head("chunk"), "choices": [], "usage": _usage(usages)})
        yield "data: [DONE]\n\n"
    finally:
        await rest.aclose()  # the client went away: the backend cancels the request


class _Shape:
    """OpenAI response shapes of one request (completion or chat)."""

    def __init__(self, request_id: str, model: str, chat: bool, backend: GenerateBackend):
        self.request_id, self.model, self.chat, self.backend = request_id, model, chat, backend
        self.created = int(time.time())

    def head(self, kind: str) -> dict[str, Any]:
        objects = {
            ("chunk", True): "chat.completion.chunk",
            ("chunk", False): "text_completion",
            ("full", True): "chat.completion",
            ("full", False): "text_completion",
        }
        return {
            "id": self.request_id,
            "object": objects[kind, self.chat],
            "created": self.created,
            "model": self.model,
        }

    def chunk(self, index: int, piece: Any, finish_reason: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason}
        if self.chat:
            choice["delta"] = piece
        else:
            choice.update(text=piece, logprobs=None)
        return {**self.head("chunk"), "choices": [choice]}

    def full(self, outputs: list[SampleOutput], num_samples: int) -> dict[str, Any]:
        tokens: dict[int, list[int]] = {i: [] for i in range(num_samples)}
        reasons: dict[int, str | None] = dict.fromkeys(range(num_samples))
        usages: dict[int, Usage] = {}
        for output in outputs:
            tokens[output.sample_index] += output.token_ids
            if output.finished:
                reasons[output.sample_index] = output.finish_reason
            if output.usage is not None:
                usages[output.sample_index] = output.usage
        choices = []
        for index in range(num_samples):
            text = self.backend.tokenizer.decode(tokens[index])
            choice: dict[str, Any] = {"index": index, "finish_reason": reasons[index]}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice.update(text=text, logprobs=None)
            choices.append(choice)
        return {**self.head("full"), "choices": choices, "usage": _usage(usages)}


def _usage(usages: dict[int, Usage]) -> dict[str, Any] | None:
    if not usages:
        return None
    first = usages[min(usages)]
    completion = sum(u.completion_tokens for u in usages.values())
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
        "ttft_seconds": first.ttft_seconds,
        "mean_itl_seconds": first.mean_itl_seconds,
    }


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _error(status: int, message: str, param: str | None, kind: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)
