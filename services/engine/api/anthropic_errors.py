"""Anthropic-shaped errors for the `/v1/messages` routes (the OpenAI routes keep theirs).

Every failure is `{"type": "error", "error": {"type", "message"}}`, the message starting with
the client's field (`messages[1].content[0].type: ...`), with Anthropic's statuses: 400
invalid_request_error, 404 not_found_error (an unknown model or path), 413
request_too_large, 500 api_error (a request failed inside the engine), 529 overloaded_error
(no engine could take it: the SDKs retry that one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from ..request.engine_request import EngineStoppedError, InvalidRequestError, SequenceFailedError
from .anthropic_params import ModelNotFoundError
from .openai_errors import param_of

MESSAGES_PATH = "/v1/messages"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


def too_large_body(path: str, message: str) -> dict[str, Any] | None:
    """The 413 body for a Messages route (BodyLimit answers before any route runs)."""
    return error_body(413, message) if path.startswith(MESSAGES_PATH) else None


def validation_message(error: RequestValidationError) -> str:
    # Of a union's failures (a string, or a list of blocks) the deepest names the bad part.
    errors = sorted(error.errors(), key=lambda e: -len(e.get("loc", ()))) or [{"msg": "invalid"}]
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"body: not valid JSON: {first.get('msg')}"
    loc = tuple(first.get("loc", ()))
    # A block of unknown type fails on its tag: name the block's `type`.
    param = param_of(loc) or "body"
    if first.get("type") in ("invalid_block_type", "union_tag_not_found"):
        param += ".type"
    return f"{param}: {first.get('msg', 'invalid')}"


def answer_for(error: Exception) -> JSONResponse | None:
    """The Anthropic response for an error raised while serving a Messages route."""
    if isinstance(error, RequestValidationError):
        return error_response(400, validation_message(error))
    if isinstance(error, ModelNotFoundError):
        return error_response(404, str(error))
    if isinstance(error, InvalidRequestError):
        return error_response(400, str(error))
    if isinstance(error, EngineStoppedError):
        return error_response(529, f"overloaded: {error}")
    if isinstance(error, SequenceFailedError):
        return error_response(500, str(error))
    if isinstance(error, HTTPException):
        return error_response(error.status_code, str(error.detail))
    return None


class AnthropicRoute(APIRoute):
    """A route whose errors are answered in Anthropic's shape, before the app's handlers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as error:
                answer = answer_for(error)
                if answer is None:
                    raise
                return answer

        return handle


def sse_error(error: Exception) -> str:
    """The `error` event of a stream that already started (its status is sent: 200)."""
    answer = answer_for(error)
    body = json.loads(answer.body) if answer is not None else error_body(500, str(error))
    return f"event: error\ndata: {json.dumps(body)}\n\n"
