"""The fleet secret: what a rank shows the router's rank-facing port (RankRegistry).

A Kubernetes Secret fills it, as a file (`--fleet-secret-file`) or the environment variable
`KVFLEET_FLEET_SECRET`; ranks send it as gRPC metadata on every RankRegistry call, and the router
refuses a call without it (UNAUTHENTICATED) before reading its body, so an unauthenticated
caller costs the router no memory. Each method's messages are capped at what a legal one
needs. Health checks stay open (probes carry no secret).
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

import grpc

SECRET_ENV = "KVFLEET_FLEET_SECRET"
SECRET_METADATA_KEY = "x-kvfleet-fleet-secret"
GUARDED_PREFIX = "/kvfleet.RankRegistry/"


def load_fleet_secret(path: str | None = None) -> str | None:
    """The secret from `path` (surrounding whitespace dropped), else from the environment."""
    if path:
        secret = Path(path).read_text().strip()
        if not secret:
            raise ValueError(f"fleet secret file {path}: empty")
        return secret
    return os.environ.get(SECRET_ENV) or None


def secret_metadata(secret: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata a rank sends with each RankRegistry call."""
    return ((SECRET_METADATA_KEY, secret),) if secret else ()


# What a legal request of each RankRegistry method can need: a registration or a heartbeat is
# a few hundred bytes; a KV event batch is cut by the rank to KV_BATCH_BYTES (router_link.py).
KV_BATCH_BYTES = 1024 * 1024
METHOD_MESSAGE_BYTES = {
    f"{GUARDED_PREFIX}Register": 64 * 1024,
    f"{GUARDED_PREFIX}Heartbeat": 64 * 1024,
    f"{GUARDED_PREFIX}PublishKvEvents": 2 * KV_BATCH_BYTES,
}
# The rank port's transport cap: the largest of the above (a call past it fails in gRPC itself).
RANK_PORT_MESSAGE_BYTES = max(METHOD_MESSAGE_BYTES.values())


class FleetSecretInterceptor(grpc.ServerInterceptor):
    """Refuses RankRegistry calls whose metadata lacks the fleet secret (when there is one)
    before a byte of their body is read, and messages larger than their method needs."""

    def __init__(self, secret: str | None) -> None:
        self._secret = secret.encode() if secret else None

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if not method.startswith(GUARDED_PREFIX):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        if self._secret is not None:
            shown = dict(handler_call_details.invocation_metadata or ()).get(
                SECRET_METADATA_KEY, ""
            )
            if not hmac.compare_digest(shown.encode(), self._secret):
                return _refusal(handler)
        return _capped(handler, method, METHOD_MESSAGE_BYTES.get(method))


def _refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler that aborts with UNAUTHENTICATED without reading the request.

    NOTE: grpc reads a unary request whole before calling its handler (up to the port's
    message cap, 80 MiB on the client port); a request-streaming handler reads only when it
    iterates, so the refusal is always one and the caller's body is never taken in.
    """

    def deny(_requests, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{SECRET_METADATA_KEY}: missing or wrong")

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    return grpc.stream_unary_rpc_method_handler(deny)


class _Oversized:
    """What the size check turns a too-large message into, for the handler to refuse."""

    def __init__(self, size: int) -> None:
        self.size = size


def _capped(handler: grpc.RpcMethodHandler, method: str, cap: int | None):
    """The handler, refusing a message over `cap` bytes with RESOURCE_EXHAUSTED."""
    if cap is None:
        return handler
    parse = handler.request_deserializer

    def deserialize(data: bytes):
        return _Oversized(len(data)) if len(data) > cap else parse(data)

    def check(message, context):
        if isinstance(message, _Oversized):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{method}: message of {message.size} bytes, at most {cap}",
            )
        return message

    if handler.request_streaming:
        behaviour = handler.stream_unary or handler.stream_stream
        make = (
            grpc.stream_unary_rpc_method_handler
            if handler.stream_unary
            else grpc.stream_stream_rpc_method_handler
        )

        def streamed(requests, context):
            return behaviour((check(m, context) for m in requests), context)

        wrapped = streamed
    else:
        behaviour = handler.unary_unary or handler.unary_stream
        make = (
            grpc.unary_unary_rpc_method_handler
            if handler.unary_unary
            else grpc.unary_stream_rpc_method_handler
        )

        def single(request, context):
            return behaviour(check(request, context), context)

        wrapped = single
    return make(
        wrapped,
        request_deserializer=deserialize,
        response_serializer=handler.response_serializer,
    )
