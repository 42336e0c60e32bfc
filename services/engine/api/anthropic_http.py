"""The Anthropic Messages API on the OpenAI app: `POST /v1/messages` (SSE with `stream: true`)
and `POST /v1/messages/count_tokens`, over the same generate backend (an engine core or the
router), so `ANTHROPIC_BASE_URL` can point at a rank or at the fleet's front.

A stream sends Anthropic's events: `message_start`, `ping`, per block `content_block_start`,
`content_block_delta` (`text_delta`, `input_json_delta`), `content_block_stop`, then
`message_delta` (stop_reason, stop_sequence, the usage) and `message_stop`; a failure after
the stream started is an `error` event. The usage in `message_start` has the prompt's size
only: the engine reports reuse with the last token, so `message_delta` carries the full usage.
With `tools` (and a `tool_choice` other than `none`) on an app that knows the model's tool-call
syntax, the calls in the output come back as `tool_use` blocks and stop_reason `tool_use`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from starlette.exceptions import HTTPException

from ..core.detokenizer import StopText, StreamDetokenizer, first_stop
from ..model.tokenizer import Tokenizer
from ..request.engine_request import SampleOutput, Usage
from .anthropic_chat import openai_tool
from .anthropic_content import (
    BlockEvents,
    OutputPieces,
    ToolParsing,
    content_blocks,
    parse_output,
)
from .anthropic_errors import AnthropicRoute, sse_error
from .anthropic_params import PreparedMessages, check_model, messages_prompt, prepare
from .anthropic_schema import CountTokensRequest, MessagesRequest
from .anthropic_shapes import event, matched_stop, message_body, stop_reason_of, usage_body
from .client_gone import all_outputs, first_output
from .http_backends import GenerateBackend
from .served_by import served_headers
from .tool_markers import tool_text_tokenizer


def add_messages_routes(
    app: FastAPI, backend: GenerateBackend, tool_family: str | None = None
) -> None:
    """Mount the Messages routes on `app` (errors in Anthropic's shape on these routes only);
    `tool_family`: the model's tool-call syntax (tool_calls.py), None: calls stay text."""
    router = APIRouter(route_class=AnthropicRoute)

    @router.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request, response: Response):
        prepared = prepare(body, backend, request, tool_family)
        stream = backend.generate(prepared.call)
        # Pull the first output before answering, so bad input is a 4xx, not a broken stream.
        first = await first_output(request, stream)
        parsing = tool_parsing(tool_family, body)
        tokenizer = output_tokenizer(backend, parsing)
        if body.stream:
            events = _sse(tokenizer, body, prepared, parsing, first, stream, request)
            return StreamingResponse(
                events, media_type="text/event-stream", headers=served_headers(first)
            )
        response.headers.update(served_headers(first))
        outputs = await all_outputs(request, first, stream)
        return _whole(tokenizer, body, prepared, parsing, outputs)

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest):
        check_model(body, backend)
        return {"input_tokens": len(messages_prompt(body, backend))}

    @router.api_route(
        "/v1/messages/{rest:path}",
        methods=["GET", "POST", "PUT", "DELETE"],
        include_in_schema=False,  # a catch-all for Anthropic's 404, not an operation
    )
    async def unknown(rest: str):
        raise HTTPException(404, f"/v1/messages/{rest}: no such endpoint")

    app.include_router(router)


def tool_parsing(family: str | None, body: MessagesRequest) -> ToolParsing | None:
    """How this request's output is parsed for calls; None: it is all text (no family, no
    tools offered, or `tool_choice` `none`: the client asked for text)."""
    if family is None or not body.tools:
        return None
    if body.tool_choice is not None and body.tool_choice.type == "none":
        return None
    return ToolParsing(family, [openai_tool(tool) for tool in body.tools])


def output_tokenizer(backend: GenerateBackend, parsing: ToolParsing | None) -> Tokenizer:
    """The tokenizer the output is decoded with: parsed text keeps the family's call markers
    that are special tokens (decoding for the client drops those)."""
    if parsing is None:
        return backend.tokenizer
    return tool_text_tokenizer(backend.tokenizer, parsing.family)


def _whole(
    tokenizer: Tokenizer,
    body: MessagesRequest,
    prepared: PreparedMessages,
    parsing: ToolParsing | None,
    outputs: list[SampleOutput],
) -> dict:
    tokens = [token for output in outputs for token in output.token_ids]
    last = outputs[-1] if outputs else None
    text = tokenizer.decode(tokens)
    stops = prepared.call.sampling.stop
    stop_sequence = matched_stop(text, stops) if stops else None
    if stop_sequence is not None:
        text = text[: first_stop(text, stops)]
    text, calls = parse_output(text, parsing)
    reason = stop_reason_of(last.finish_reason if last else None, stop_sequence, bool(calls))
    usage = usage_body(last.usage if last else None, prepared.breakpoints)
    return message_body(
        prepared.call.request_id,
        body.model,
        content_blocks(text, calls),
        reason,
        stop_sequence,
        usage,
    )


async def _sse(
    tokenizer: Tokenizer,
    body: MessagesRequest,
    prepared: PreparedMessages,
    parsing: ToolParsing | None,
    first: SampleOutput | None,
    rest: AsyncIterator[SampleOutput],
    request: Request,
) -> AsyncIterator[str]:
    call = prepared.call
    start_usage = {
        "input_tokens": len(call.prompt_token_ids),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    }
    detokenizer = StreamDetokenizer(tokenizer)
    stops = StopText(call.sampling.stop)
    pieces, blocks = OutputPieces(parsing), BlockEvents()
    said, usage, finish_reason = "", None, None

    def lines_of(output: SampleOutput) -> list[str]:
        nonlocal said, usage, finish_reason
        usage = output.usage or usage
        finish_reason = output.finish_reason or finish_reason
        if 0 in stops.stopped:
            return []  # the text already ended at a stop sequence
        piece = detokenizer.piece(0, output.token_ids, output.finished)
        said += piece
        text = stops.feed(0, piece, output.finished)
        return [line for part in pieces.feed(text) for line in blocks.piece(part)]

    try:
        message = message_body(call.request_id, body.model, [], None, None, start_usage)
        yield event("message_start", {"message": message})
        yield event("ping", {})
        for line in lines_of(first) if first is not None else []:
            yield line
        async for output in rest:
            # NOTE: ask the server between tokens: a stream nobody reads must not hold pages.
            if await request.is_disconnected():
                return
            for line in lines_of(output):
                yield line
        for part in pieces.finish():
            for line in blocks.piece(part):
                yield line
        for line in blocks.finish():
            yield line
        stop_sequence = matched_stop(said, call.sampling.stop) if stops.stopped else None
        reason = stop_reason_of(finish_reason, stop_sequence, blocks.tool_calls > 0)
        delta = {"stop_reason": reason, "stop_sequence": stop_sequence}
        final: Usage | None = usage
        totals = usage_body(final, prepared.breakpoints)
        yield event("message_delta", {"delta": delta, "usage": totals})
        yield event("message_stop", {})
    except Exception as error:  # the status is already sent: the client reads an error event
        yield sse_error(error)
    finally:
        await rest.aclose()  # the client went away: the backend cancels the request
