"""The fleet secret: what a rank shows the router's rank-facing port (RankRegistry).

A Kubernetes Secret fills it, as a file (`--fleet-secret-file`) or the environment variable
`KVFLEET_FLEET_SECRET`; ranks send it as gRPC metadata on every RankRegistry call, and the router
refuses a call without it (UNAUTHENTICATED). Health checks stay open (probes carry no secret).
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


class FleetSecretInterceptor(grpc.ServerInterceptor):
    """Refuses RankRegistry calls whose metadata lacks the fleet secret."""

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()

    def intercept_service(self, continuation, handler_call_details):
        if not handler_call_details.method.startswith(GUARDED_PREFIX):
            return continuation(handler_call_details)
        shown = dict(handler_call_details.invocation_metadata or ()).get(SECRET_METADATA_KEY, "")
        if hmac.compare_digest(shown.encode(), self._secret):
            return continuation(handler_call_details)
        return _refusal(continuation(handler_call_details))


def _refusal(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
    """A handler of the same shape that aborts with UNAUTHENTICATED."""
    if handler is None:
        return None

    def deny(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{SECRET_METADATA_KEY}: missing or wrong")

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)
