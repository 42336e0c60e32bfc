"""Benchmark: is pulling a moved turn's prefix over the `grpc` hand-off transport faster than
recomputing it?

Measured: the transport's own path on loopback, one real `PullKvBlocks` stream served by the
engine's `serve_pull` and fetched by `GrpcPull` (proto encoding, gRPC, decoding, each block's
CRC32 check), for blocks of 8b pages (128 KiB per token: 2 MiB at 16 tokens, 8 MiB at 64).
Not measured: the page reads and writes on each side (device <-> host copies, ~50 GB/s on the
H200 machine: docs/tiers.md), which only add to it.

Compared with: the cost model's time to recompute the same prefix on the H200 (8b, the
figures fitted to measured TTFTs: services/core/sim_costs.yaml). Prints, per prefix length,
the pull's time at the measured rate, the recompute's, and the link rate a pull needs to win.

Run: .venv/bin/python bench/pull_transport_bench.py [--blocks 64] [--reps 3]
"""

from __future__ import annotations

import argparse
import time

from kvfleet.proto import engine_pb2_grpc
from kvfleet.proto.pooled_server import PooledServer
from kvfleet.services.core.cost_figures import load_hardware
from kvfleet.services.core.cost_model import CostModel, StepWork
from kvfleet.services.disagg.blocks import KVBlock
from kvfleet.services.disagg.grpc_pull import GrpcPull, serve_pull
from kvfleet.services.disagg.transport_types import FetchRequest
from kvfleet.services.engine.compute.compute_sim import cost_shape
from kvfleet.services.engine.config.model_config import preset

BYTES_PER_TOKEN = 128 * 1024  # 8b: 32 layers x K,V x 8 heads x 128 dims x 2 bytes


class BlockServer(engine_pb2_grpc.EngineServicer):
    """Serves the same blocks to every pull, as an engine's PullKvBlocks does."""

    def __init__(self, blocks: list[KVBlock]) -> None:
        self.blocks = blocks

    def PullKvBlocks(self, request, context):
        yield from serve_pull(lambda *_: self.blocks, ("full",), request, context)


def transport_gb_s(page_tokens: int, num_blocks: int, reps: int) -> float:
    """Best GB/s of one pull of `num_blocks` blocks of `page_tokens` 8b tokens."""
    data = bytes(range(256)) * (page_tokens * BYTES_PER_TOKEN // 256)
    blocks = [KVBlock("full", index, index + 1, data) for index in range(num_blocks)]
    server = PooledServer(4, "pull-bench")
    engine_pb2_grpc.add_EngineServicer_to_server(BlockServer(blocks), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    pull = GrpcPull(("full",))
    best = float("inf")
    try:
        request = FetchRequest("bench", f"127.0.0.1:{port}", (), {}, 600.0, prompt=(1,))
        for _ in range(reps):
            started = time.perf_counter()
            got = pull.fetch(request)
            best = min(best, time.perf_counter() - started)
            assert len(got) == num_blocks
    finally:
        pull.close()
        server.stop(None)
    return num_blocks * len(data) / best / 1e9


def recompute_seconds(tokens: int) -> float:
    """The cost model's prefill of `tokens` uncached 8b tokens on the H200, in 8k chunks."""
    costs = CostModel.from_figures(cost_shape(preset("8b")), load_hardware(), 64)
    spans = [(start, min(start + 8192, tokens)) for start in range(0, tokens, 8192)]
    return sum(costs.step_seconds(StepWork((span,))) for span in spans)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=64, help="blocks per pull")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    rates = {tokens: transport_gb_s(tokens, args.blocks, args.reps) for tokens in (16, 64)}
    for tokens, rate in rates.items():
        size = tokens * BYTES_PER_TOKEN / 2**20
        print(f"grpc transport, {size:.0f} MiB blocks x {args.blocks}: {rate:.2f} GB/s")
    rate = max(rates.values())
    print("\n| prefix tokens | KV GB | pull at the measured rate s | recompute on H200 s "
          "| link a pull needs GB/s |")  # fmt: skip
    print("|---|---|---|---|---|")
    for tokens in (8_192, 32_768, 100_000):
        size = tokens * BYTES_PER_TOKEN / 1e9
        recompute = recompute_seconds(tokens)
        print(f"| {tokens} | {size:.1f} | {size / rate:.2f} | {recompute:.2f} "
              f"| {size / recompute:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
