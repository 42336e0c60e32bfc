"""The OpenAI-compatible HTTP API over a generate backend (an engine core, or the router).

Endpoints: `/v1/completions`, `/v1/chat/completions` (SSE with `stream: true`), `/v1/models`,
`/health`, and Anthropic's `/v1/messages` (anthropic_http.py). Bodies are typed models
(openai_schema.py), so `/openapi.json` documents them and bad input is a 400 naming the field
(openai_errors.py); a body over `max_body_bytes` is a 413.
The conversation id (for the prefix cache's retention and the router's pins) comes from
session_identity.py (headers, `prompt_cache_key`, `conversation_id`, else the chat's opening;
never `user`). Usage reports reused prompt tokens in `prompt_tokens_details.cached_tokens`,
`cache_write_tokens` (what it wrote there, docs/api.md), `ttft_seconds`, `mean_itl_seconds`.
A chat request with `tools` gets the calls in the model's text back as `tool_calls` when the
app knows the checkpoint's call syntax (`tool_family`, openai_tools.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..core.detokenizer import StopText, StreamDetokenizer
from ..request.engine_request import SampleOutput, Usage
from .anthropic_errors import too_large_body
from .anthropic_http import add_messages_routes
from .client_gone import ClientGone, all_outputs, first_output
from .http_backends import BackendRequest, GenerateBackend
from .openai_errors import DEFAULT_MAX_BODY_BYTES, BodyLimit, install_error_handlers, json_body
from .openai_params import Body, backend_request, chat_prompt, completion_prompt
from .openai_schema import ChatCompletionRequest, CompletionRequest
from .openai_shapes import ResponseShape, sse_event, usage_body
from .openai_tools import ToolChunks, parsing_family, with_tool_calls
from .served_by import served_headers
from .tool_markers import tool_text_tokenizer

__all__ = ["build_app", "json_body"]

HealthCheck = Callable[[], bool]


def build_app(
    backend: GenerateBackend,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    healthy: HealthCheck | None = None,
    tool_family: str | None = None,
    health_details: Callable[[], Mapping[str, str]] | None = None,
) -> FastAPI:
    """The FastAPI app; mount it on an engine rank or in front of the router.

    `healthy` decides `/health` (200 when it says True, else 503); without it, always 200.
    `health_details` adds its fields to the body (the router's Redis state).
    `tool_family` is the model's tool-call syntax (tool_calls.py); None: calls stay text.
    """
    app = FastAPI(title="kvfleet", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, shape_for_path=too_large_body)

    @app.get("/health")
    async def health() -> JSONResponse:
        details = dict(health_details()) if health_details is not None else {}
        if healthy is not None and not await asyncio.to_thread(healthy):
            return JSONResponse({"status": "unavailable", **details}, status_code=503)
        return JSONResponse({"status": "ok", **details})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = dict(backend.model_card)
        data = [
            {"id": n, "object": "model", "owned_by": "kvfleet", **card} for n in backend.model_names
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request, response: Response):
        prompt = completion_prompt(body, backend)
        return await _respond(backend, request, response, body, prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request, response: Response):
        prompt = chat_prompt(body, backend)
        family = parsing_family(tool_family, body.tools, body.tool_choice)
        return await _respond(backend, request, response, body, prompt, chat=True, family=family)

    add_messages_routes(app, backend, tool_family)  # the Anthropic Messages API
    return app


async def _client_gone(_request: Request, _error: Exception) -> Response:
    """Nobody reads this answer: 499, nginx's "client closed request", for the access log."""
    return Response(status_code=499)


async def _respond(
    backend: GenerateBackend,
    request: Request,
    reply: Response,
    body: Body,
    prompt: list[int],
    chat: bool,
    family: str | None = None,
):
    call = backend_request(backend, request, body, prompt, family)
    stream = backend.generate(call)
    # Pull the first output before answering, so bad input is a 400, not a broken stream.
    first = await first_output(request, stream)
    # Parsed text keeps the call markers that are special tokens (decoding drops those).
    tokenizer = tool_text_tokenizer(backend.tokenizer, family) if family else backend.tokenizer
    shape = ResponseShape(call.request_id, body.model, chat, tokenizer)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        tools = ToolChunks(shape, family, body.tools or []) if family else None
        return StreamingResponse(
            _sse(shape, call, first, stream, include_usage, request, tools, body.return_token_ids),
            media_type="text/event-stream",
            headers=served_headers(first),
        )
    reply.headers.update(served_headers(first))
    outputs = await all_outputs(request, first, stream)
    response = shape.full(outputs, call.num_samples, call.sampling.stop, body.return_token_ids)
    return with_tool_calls(response, family, body.tools or []) if family else response


async def _sse(
    shape: ResponseShape,
    call: BackendRequest,
    first: SampleOutput | None,
    rest: AsyncIterator[SampleOutput],
    include_usage: bool,
    request: Request,
    tools: ToolChunks | None = None,
    token_ids: bool = False,
) -> AsyncIterator[str]:
    usages: dict[int, Usage] = {}
    detokenizer = StreamDetokenizer(shape.tokenizer)
    stops = StopText(call.sampling.stop)

    def events(output: SampleOutput) -> list[str]:
        index = output.sample_index
        if output.usage is not None:
            usages[index] = output.usage
        if index in stops.stopped:
            return []  # the text already ended at a stop string
        text = stops.feed(index, detokenizer.piece(index, output.token_ids, output.finished),
                          output.finished)  # fmt: skip
        reason = output.finish_reason or None
        if index in stops.stopped:
            reason = "stop"
        if tools is not None:
            return tools.lines(index, text, reason, output.logprobs)
        ids = output.token_ids if token_ids else None
        if not text and not reason and not output.logprobs and not ids:
            return []  # held back: nothing to send yet
        piece = {"content": text} if shape.chat else text
        return [sse_event(shape.chunk(index, piece, reason, output.logprobs, ids))]

    try:
        if shape.chat:
            for index in range(call.num_samples):
                yield sse_event(shape.chunk(index, {"role": "assistant", "content": ""}, None))
        for line in events(first) if first is not None else []:
            yield line
        async for output in rest:
            # NOTE: ask the server between tokens: whether a write to a closed socket raises
            # depends on the server, and a stream nobody reads must not hold its pages.
            if await request.is_disconnected():
                return
            for line in events(output):
                yield line
        if include_usage:
            yield sse_event({**shape.head("chunk"), "choices": [], "usage": usage_body(usages)})
        yield "data: [DONE]\n\n"
    finally:
        await rest.aclose()  # the client went away: the backend cancels the request
