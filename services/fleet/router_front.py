"""The OpenAI HTTP API served next to a router, over the router's own gRPC Generate.

`kvfleet router --http-port 8000` starts one beside the router (the router Service's `http`
port in a deployed fleet), and `kvfleet up` starts one in front of its embedded router, so
OpenAI clients get the router's conversation pins. `GET /health` is 200 while the router's
gRPC health answers SERVING (Kubernetes httpGet probes), else 503; its body says where pins
live and, while the router runs degraded on local state, Redis's last error (a wrong password
shows there). Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..engine.api.http_backends import RouterBackend
from ..engine.api.http_server import HttpServer
from ..engine.api.openai_http import build_app
from ..engine.model.tokenizer import Tokenizer, tokenizer_for_model

HEALTH_TIMEOUT_SECONDS = 2.0


def front_tokenizer(model_path: str | None) -> Tokenizer:
    """The checkpoint's tokenizer (it must be the engines'), or the presets' byte tokenizer."""
    if model_path and not (Path(model_path) / "tokenizer.json").is_file():
        raise FileNotFoundError(f"--model-path {model_path}: no tokenizer.json there")
    return tokenizer_for_model(model_path)


class RouterFront:
    """The OpenAI app over a router's Generate, on its own uvicorn thread."""

    def __init__(
        self,
        router_address: str,
        tokenizer: Tokenizer,
        model_names: tuple[str, ...],
        card: Mapping[str, int] | None = None,
        host: str = "0.0.0.0",
        port: int = 8000,
        tls: tuple[str, str] | None = None,
        tool_family: str | None = None,
        max_request_tokens: int | None = None,
        health_details: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """`router_address` is plain gRPC (the router's loopback port when its client port
        serves TLS); `tls=(certificate chain, key)` serves HTTPS; `tool_family` is the
        engines' tool-call syntax (tool_calls.py; None: calls stay text); `max_request_tokens` the
        ranks' longest request (a chat's default `max_tokens` stays inside it)."""
        self.backend = RouterBackend(
            router_address, tokenizer, model_names, card, max_request_tokens
        )
        self._health_channel = grpc.insecure_channel(router_address)
        self._health = health_pb2_grpc.HealthStub(self._health_channel)
        self.tool_family = tool_family
        app = build_app(
            self.backend,
            healthy=self.serving,
            tool_family=tool_family,
            health_details=health_details,
        )
        self.http = HttpServer(app, host, port, tls)

    @property
    def port(self) -> int | None:
        return self.http.port

    def serving(self) -> bool:
        """Whether the router answers its gRPC health check with SERVING."""
        try:
            answer = self._health.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=HEALTH_TIMEOUT_SECONDS
            )
        except grpc.RpcError:
            return False
        return answer.status == health_pb2.HealthCheckResponse.SERVING

    def start(self) -> RouterFront:
        self.http.start()
        return self

    def stop(self) -> None:
        self.backend.close()  # on the serving loop, before it stops
        self.http.stop()
        self._health_channel.close()
