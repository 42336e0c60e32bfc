"""gRPC reflection answers under v1 (what grpcurl asks first) and v1alpha, on a real router."""

from __future__ import annotations

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2
from kvfleet.proto import router_pb2
from kvfleet.services.router.server import RouterConfig, create_server

NAMES = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")


@pytest.fixture
def channel():
    server, port = create_server("127.0.0.1:0", RouterConfig())
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield channel
    channel.close()
    server.stop(0)


@pytest.mark.parametrize("service", NAMES)
def test_reflection_lists_the_router_under_both_names(channel, service: str) -> None:
    """If this fails, a reflection client (grpcurl list) of that protocol version gets
    UNIMPLEMENTED or no kvfleet service."""
    call = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (response,) = list(call(iter([request]), timeout=30))
    names = {service.name for service in response.list_services_response.service}
    assert router_pb2.DESCRIPTOR.services_by_name["Router"].full_name in names, names
    assert "grpc.health.v1.Health" in names
