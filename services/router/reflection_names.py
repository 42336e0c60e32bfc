"""gRPC server reflection under both of its names.

grpcio-reflection implements `grpc.reflection.v1alpha.ServerReflection`; grpcurl, Postman and
current grpc tooling ask for `grpc.reflection.v1.ServerReflection` first. The two protocols'
messages are the same on the wire, so the one servicer answers both. The list of services
names v1alpha only: the v1 descriptors are not in this process's pool, so a client that asked
to describe them would get NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"


def enable_reflection(service_names: Iterable[str], server: grpc.Server) -> None:
    """Serve reflection over `service_names` (and reflection itself) as v1 and v1alpha."""
    servicer = reflection.ReflectionServicer((*service_names, reflection.SERVICE_NAME))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        V1_SERVICE_NAME,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))
