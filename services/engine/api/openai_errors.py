"""OpenAI-style error bodies for the HTTP API, whose `param` names the client's field.

Every failure is `{"error": {"message", "type", "param", "code"}}`: validation errors are 400
(FastAPI's 422 included), a body over the limit is 413, the engine gone is 503. Names the
engine or the router use inside (`num_samples`, `child_samples`, `sampling.temperature`,
`prompt_token_ids`) are mapped back to the OpenAI field the client sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..request.engine_request import EngineStoppedError, InvalidRequestError, SequenceFailedError

# Internal field names -> what the client sent.
CLIENT_FIELDS = {
    "num_samples": "n",
    "child_samples": "n",
    "prompt_token_ids": "prompt",
    "prompt_text": "prompt",
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.seed": "seed",
    "sampling.stop_token_ids": "stop_token_ids",
    "sampling": "temperature",
    "conversation_id": "conversation_id",
}
_TYPE_TAG = re.compile(r"^[a-z_-]+\[.*\]$|^(str|int|float|bool|none|dict|list)$|^[A-Z]")
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


def client_field(field: str, chat: bool) -> str:
    """The OpenAI name of an internal field (`prompt` is `messages` in a chat request)."""
    name = CLIENT_FIELDS.get(field, field)
    return "messages" if chat and name == "prompt" else name


def param_of(loc: tuple[Any, ...]) -> str | None:
    """`messages[0].content` from pydantic's ('body', 'messages', 0, 'content', 'str')."""
    parts: list[str] = []
    for item in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(item, int):
            if not parts:
                break  # a JSON decode position, not a field
            parts[-1] += f"[{item}]"
        elif _TYPE_TAG.match(str(item)):
            continue  # a union member's tag, not a field
        else:
            parts.append(str(item))
    return ".".join(parts) or None


def error_response(status: int, message: str, param: str | None, kind: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (for untyped routes); InvalidRequestError naming `body`."""
    try:
        body = await request.json()
    except (ValueError, RecursionError) as error:  # RecursionError: nesting too deep
        raise InvalidRequestError("body", f"not JSON: {error}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    return body


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure of `app` as an OpenAI error body."""

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {"loc": (), "msg": "invalid body"}
        param = param_of(tuple(first.get("loc", ())))
        message = str(first.get("msg", "invalid"))
        if first.get("type") == "json_invalid":
            param, message = None, f"body is not valid JSON: {message}"
        return error_response(400, f"{param or 'body'}: {message}", param, "invalid_request_error")

    @app.exception_handler(InvalidRequestError)
    async def invalid(request: Request, error: InvalidRequestError) -> JSONResponse:
        param = client_field(error.field, request.url.path.endswith("/chat/completions"))
        message = str(error).partition(": ")[2] or str(error)
        return error_response(400, f"{param}: {message}", param, "invalid_request_error")

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, error: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        return error_response(error.status_code, str(error.detail), None, kind)

    @app.exception_handler(EngineStoppedError)
    async def unavailable(_request: Request, error: EngineStoppedError) -> JSONResponse:
        return error_response(503, str(error), None, "service_unavailable")

    @app.exception_handler(SequenceFailedError)
    async def failed(_request: Request, error: SequenceFailedError) -> JSONResponse:
        return error_response(500, str(error), None, "server_error")


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is a 413 before the app parses it."""

    def __init__(
        self,
        app,
        max_bytes: int = DEFAULT_MAX_BODY_BYTES,
        shape_for_path: Callable[[str, str], dict[str, Any] | None] | None = None,
    ) -> None:
        """`shape_for_path(path, message)`: another API's 413 body for its paths, else None."""
        self.app = app
        self.max_bytes = max_bytes
        self.shape_for_path = shape_for_path

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, send, int(declared))
            return
        messages, size = [], 0
        while True:  # buffer the body (the app reads it whole anyway), counting bytes
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._too_large(scope, send, size)
                return
            if not message.get("more_body"):
                break
        replay = iter(messages)

        async def replayed():
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)

    async def _too_large(self, scope, send, size: int) -> None:
        message = (
            f"request body of {size} bytes is over the limit of {self.max_bytes} bytes "
            f"({self.max_bytes // 2**20} MiB)"
        )
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                          "code": "request_too_large"}}  # fmt: skip
        if self.shape_for_path is not None:
            body = self.shape_for_path(scope.get("path", ""), message) or body
        payload = json.dumps(body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(payload)),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
