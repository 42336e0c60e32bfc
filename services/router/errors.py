"""Domain errors of the router, and the one place that maps them to gRPC status codes."""

from __future__ import annotations

import grpc


class RouterError(Exception):
    """Base of the errors a client gets back."""


class InvalidRequest(RouterError):
    """The request breaks a rule; names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class RankUnavailable(RouterError):
    """No rank could serve the request (rank gone, failed mid-stream, none registered)."""


class QueueTimeout(RouterError):
    """The request waited longer than the router's queue limit without a slot."""


class DuplicateRequest(RouterError):
    """A request with this id is already in flight."""


class EngineRejected(RouterError):
    """The engine rank refused the request itself (its status code is passed on)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


GRPC_CODES: dict[type[RouterError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    RankUnavailable: grpc.StatusCode.UNAVAILABLE,
    QueueTimeout: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DuplicateRequest: grpc.StatusCode.ALREADY_EXISTS,
}


def grpc_code(error: RouterError) -> grpc.StatusCode:
    """The status code a domain error is reported with."""
    if isinstance(error, EngineRejected):
        return error.code
    return GRPC_CODES[type(error)]
