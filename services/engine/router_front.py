"""The OpenAI HTTP API served from a router process, over the router's own gRPC Generate.

`kvfleet router --http-port 8000` starts one next to the router (the router Service's `http`
port in a deployed fleet), and `kvfleet up` starts one in front of its embedded router, so
OpenAI clients get the router's conversation pins. `GET /health` is 200 while the router's
gRPC health answers SERVING (Kubernetes httpGet probes), else 503. Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .http_backends import RouterBackend
from .http_server import HttpServer
from .openai_http import build_app
from .tokenizer import load_tokenizer

HEALTH_TIMEOUT_SECONDS = 2.0


def model_tokenizer_path(model_path: str | None) -> str | None:
    """The checkpoint's `tokenizer.json`, or None (the byte tokenizer of the presets)."""
    if not model_path:
        return None
    path = Path(model_path) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"--model-path {model_path}: no tokenizer.json there")
    return str(path)


class RouterFront:
    """The OpenAI app over a router's Generate, on its own uvicorn thread."""

    def __init__(
        self,
        router_address: str,
        model: str = "tiny",
        model_path: str | None = None,
        host: str = "0.0.0.0",
        port: int = 8000,
    ) -> None:
        tokenizer = load_tokenizer(model_tokenizer_path(model_path))
        self.backend = RouterBackend(router_address, tokenizer, (model, "kvfleet"))
        self._health_channel = grpc.insecure_channel(router_address)
        self._health = health_pb2_grpc.HealthStub(self._health_channel)
        self.http = HttpServer(build_app(self.backend, healthy=self.serving), host, port)

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
        self.http.stop()
        self.backend.close()
        self._health_channel.close()
