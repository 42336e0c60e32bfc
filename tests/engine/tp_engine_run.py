"""The engine as one rank of `--world` tensor-parallel workers (run by test_tensor_parallel_engine):
worker 0 serves a conversation whose prefix leaves the device for the host tier and comes back,
and saves the greedy tokens and tier counts; the others follow it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from engine_testkit import final, greedy, run_call, tokens_of, turn_two, two_turns
from kvfleet.kvstore.tiers.metrics import HOST
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.request.engine_request import GenerateCall

PAGE = 16


def engine_config(checkpoint: str, world: int) -> EngineConfig:
    return EngineConfig(
        model_path=checkpoint,
        dtype="float32",
        device="cpu",
        torch_threads=1,
        max_batch_size=2,
        max_num_batched_tokens=64,
        page_size=PAGE,
        kv_pages=24,
        host_kv_pages=64,
        reuse_policy="per_request",
        checkpoint_margin_tokens=32,
        tensor_parallel=world,
    )


def serve_conversation(core: EngineCore) -> dict:
    """Turn 1, a flood that pushes its prefix to the host tier, turn 2 from the host tier."""
    first, appended = two_turns(1, "c")
    turn_one = tokens_of(run_call(core, first, timeout=120))
    rng = random.Random(11)
    for i in range(3):
        prompt = tuple(rng.randrange(256) for _ in range(320))
        run_call(core, GenerateCall(f"flood-{i}", prompt, greedy(4), f"flood-{i}"), timeout=120)
    second = turn_two(first, turn_one, appended)
    outputs = run_call(core, second, timeout=120)
    hits = core.call_on_core(lambda: core.manager.tiers.metrics[HOST].hits)
    return {
        "turn_one": turn_one,
        "turn_two": tokens_of(outputs),
        "cached_tokens": final(outputs).usage.cached_tokens,
        "host_hits": hits,
    }


def main(args: argparse.Namespace) -> None:
    from kvfleet.services.engine.compute.backends import TorchCompute
    from kvfleet.services.engine.compute.rank_group import follow
    from tp_testkit import worker_group

    with worker_group(args.rendezvous, args.rank, args.world):
        config = engine_config(args.checkpoint, args.world)
        if args.rank:
            follow(config)
            return
        compute = TorchCompute(config)
        core = EngineCore(config, compute=compute).start()
        try:
            result = serve_conversation(core)
        finally:
            core.stop()
            compute.stop_workers()
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    from tp_testkit import worker_arguments

    main(worker_arguments())
