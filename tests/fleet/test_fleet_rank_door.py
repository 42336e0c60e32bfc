"""`kvfleet up` serves the rank registry on its client port, behind a secret of its own."""

from __future__ import annotations

import grpc
from kvfleet.proto import router_pb2, router_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig


def test_a_forged_register_on_the_client_port_is_refused() -> None:
    """If this fails, anyone who reaches `kvfleet up`'s port registers a rank of theirs and
    receives the fleet's prompts."""
    engine = EngineConfig(compute_backend="sim", sim_time_scale=0.0, max_batch_size=2)
    fleet = EmbeddedFleet(FleetConfig(engine, num_ranks=1, redis_url=None)).start(timeout=60.0)
    try:
        with grpc.insecure_channel(fleet.router_address) as channel:
            registry = router_pb2_grpc.RankRegistryStub(channel)
            forged = router_pb2.RegisterRequest(
                rank_id="intruder", address="127.0.0.1:9", max_batch_size=64
            )
            try:
                registry.Register(forged, timeout=10)
                code = grpc.StatusCode.OK
            except grpc.RpcError as error:
                code = error.code()
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert set(fleet.router.runtime.ranks()) == {"rank-0"}  # its own rank did register
    finally:
        fleet.stop()
