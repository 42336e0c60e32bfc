"""Live: conversations that leave their rank, with and without their KV (sim ranks).

Each arm starts a fresh embedded fleet, the one `kvfleet up --compute-backend sim --model 8b`
runs (router with pins in the local Redis when it answers, engine ranks with the sim compute
backend: the real scheduler, kvstore and tiers, step times from the cost model), replays Claude
Code sessions through the router's gRPC API, and drains one rank mid-replay as a scale-in does
(`EngineRank.drain_and_stop`, SIGTERM's path: the rank reports leaving, flushes its retained
turns to the shared disk, finishes its streams and stops). Arms:

| arm          | shared disk tier (`--disk-tier-dir`)         | router `--migrate-kv`   |
|--------------|----------------------------------------------|-------------------------|
| `off-nodisk` | no (as `kvfleet up` ran before)              | off                     |
| `off`        | yes: the drain's flush reaches the survivors | off                     |
| `on`         | yes                                          | on: a turn placed away  |
|              |                                              | from its live or leaving|
|              |                                              | home pulls its blocks   |
| `on-nodisk`  | no                                           | on                      |

Per arm: later turns (second and later of a conversation) that ran on another rank than the
conversation's previous turn ("moved"), the prompt tokens those recomputed (prompt - cached),
later turns with no reuse (< 2 % of the prompt), reuse / oracle, later turns' TTFT, and what
the ranks and the router counted (pulls, pulled tokens, blocks flushed by the drain, blocks
the drained rank sent to pulls once it was leaving).

Run (about 3 minutes per arm on the shared 2-core machine):
  .venv/bin/python bench/live_moves_bench.py --sessions 6 --ranks 3 --slots 1 --drain-at 30
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import grpc
from fleet_sizing import report_half
from kvfleet.proto import common_pb2, router_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig
from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.grpc_target import RouterGenerateTarget
from kvfleet.services.replay.measures import is_no_reuse
from kvfleet.services.replay.readers import (
    ReadOptions,
    filter_max_model_len,
    first_turns,
    read_traces,
)
from kvfleet.services.replay.records import Generation
from kvfleet.services.replay.runner import run_arm
from kvfleet.services.replay.target_types import TargetError
from kvfleet.services.replay.tokens import TokenSynthesizer
from kvfleet.services.router.admission import AdmissionConfig

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "claude_code_weka"
ARMS = {
    "off-nodisk": (False, False),
    "off": (True, False),
    "on": (True, True),
    "on-nodisk": (False, True),
}
OUTCOMES = ("pulled", "nothing", "failed", "missing", "no_room")  # of a new rank's pulls


class RankRecordingTarget(RouterGenerateTarget):
    """The router's gRPC target, also keeping which rank served each call of a conversation."""

    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        self.ranks: dict[str, list[str]] = defaultdict(list)  # conversation -> ranks, in order

    async def generate(self, conversation_id, tokens, max_tokens, branch_hints=(), layout=None):
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.address)
        stub = router_pb2_grpc.RouterStub(self._channel)
        message = self.request(conversation_id, tokens, max_tokens, branch_hints)
        times: list[float] = []
        usage: common_pb2.Usage | None = None
        rank = ""
        try:
            async for response in stub.Generate(message, timeout=self.timeout_s):
                rank = rank or response.rank_id
                if response.chunk.token_ids:
                    times.append(self.clock.now())
                if response.chunk.HasField("usage"):
                    usage = response.chunk.usage
        except grpc.aio.AioRpcError as error:
            self.ranks[conversation_id].append("")
            raise TargetError(f"{error.code().name}: {error.details()}") from error
        self.ranks[conversation_id].append(rank)
        if usage is None:
            raise TargetError("stream ended without usage")
        return Generation(
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=min(usage.cached_tokens, usage.prompt_tokens),
            output_tokens=usage.completion_tokens,
            first_token_s=times[0] if times else None,
            token_times_s=tuple(times),
            finish_s=self.clock.now(),
        )


def fleet_config(args, disk_dir: str, migrate: bool) -> FleetConfig:
    """What `kvfleet up --compute-backend sim --model M --ranks N --max-batch-size S
    [--disk-tier-dir D] [--migrate-kv]` starts, on free ports."""
    engine = EngineConfig(
        model=args.model,
        compute_backend="sim",
        sim_time_scale=args.sim_time_scale,
        max_batch_size=args.slots,
        max_num_batched_tokens=8192,
        disk_tier_dir=disk_dir,
    )
    admission = AdmissionConfig(max_wait_seconds=args.max_wait_seconds)
    return FleetConfig(engine, args.ranks, admission=admission, migrate_kv=migrate)


def later_turns(records, ranks: dict[str, list[str]]):
    """(record, moved) of every successful later turn; moved: another rank than the
    conversation's previous call."""
    by_conversation = defaultdict(list)
    for record in records:
        by_conversation[record.conversation_id].append(record)
    for conversation, recs in by_conversation.items():
        recs.sort(key=lambda r: r.arrival_s)
        served = ranks.get(conversation, [])
        for index, record in enumerate(recs):
            if index == 0 or not record.ok or index >= len(served):
                continue
            yield record, served[index] != served[index - 1]


def counter(registry, name: str, **labels) -> float:
    return registry.get_sample_value(name, labels or None) or 0.0


def blocks_sent(registry) -> float:
    """Blocks a rank sent to moved turns' pulls."""
    return counter(registry, "kvfleet_engine_moved_blocks_total", direction="sent")


def run_one(args, name: str, conversations) -> dict:
    with_disk, migrate = ARMS[name]
    with tempfile.TemporaryDirectory(prefix="kvfleet-moves-") as disk:
        fleet = EmbeddedFleet(fleet_config(args, disk if with_disk else "", migrate)).start()
        drained = next(r for r in fleet.ranks if r.addresses.rank_id == args.drain_rank)
        sent_before = []  # the drained rank's blocks sent to pulls when it starts leaving

        def drain() -> None:
            sent_before.append(blocks_sent(drained.metrics.registry))
            drained.drain_and_stop(args.drain_seconds, linger_seconds=args.drain_linger_seconds)

        timer = threading.Timer(args.drain_at, drain)
        target = RankRecordingTarget(f"grpc://{fleet.router_address}")
        synthesizer = TokenSynthesizer(args.seed, preset(args.model).vocab_size)
        options = DriverOptions(args.sessions, args.time_scale, args.stagger, 0)

        async def replay():
            try:
                return await run_arm(name, target, conversations, synthesizer, options, {})
            finally:
                await target.aclose()

        started = time.monotonic()
        try:
            timer.start()
            result = asyncio.run(replay())
        finally:
            timer.cancel()
            fleet.stop()
        wall = time.monotonic() - started
    later = list(later_turns(result.records, target.ranks))
    moved = [record for record, was_moved in later if was_moved]
    ttfts = sorted(r.ttft_s for r, _ in later if r.ttft_s is not None)
    ranks = [rank.metrics.registry for rank in fleet.ranks]
    router = fleet.router.metrics.registry
    return {
        "arm": name,
        "wall_s": wall,
        "requests": len(result.records),
        "errors": len(result.errors),
        "later": len(later),
        "moved": len(moved),
        "moved_recomputed": sum(r.prompt_tokens - r.reused_tokens for r in moved),
        "moved_prompt": sum(r.prompt_tokens for r in moved),
        "moved_no_reuse": sum(is_no_reuse(r) for r in moved),
        "no_reuse": sum(is_no_reuse(r) for r, _ in later) / max(1, len(later)),
        "reuse_oracle": result.measures.prefix_reuse / max(1e-9, result.measures.oracle_reuse),
        "ttft_p50": ttfts[len(ttfts) // 2] if ttfts else 0.0,
        "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else 0.0,
        "fallbacks": counter(router, "kvfleet_router_admissions_total", placement="fallback"),
        "kv_moves": counter(router, "kvfleet_router_kv_moves_total"),
        "outcomes": {
            outcome: sum(
                counter(r, "kvfleet_engine_moved_turns_total", outcome=outcome) for r in ranks
            )
            for outcome in OUTCOMES
        },
        "pulled_tokens": sum(counter(r, "kvfleet_engine_moved_tokens_total") for r in ranks),
        "flushed": sum(counter(r, "kvfleet_engine_drain_flushed_blocks_total") for r in ranks),
        "sent_leaving": blocks_sent(drained.metrics.registry) - sum(sent_before or [0.0]),
    }


COLUMNS = (
    ("arm", "arm", "{}"),
    ("later turns", "later", "{}"),
    ("moved turns", "moved", "{}"),
    ("recomputed after a move, ktok", "moved_recomputed", "{:.0f}"),
    ("of their prompts, ktok", "moved_prompt", "{:.0f}"),
    ("moved turns recomputed in full", "moved_no_reuse", "{}"),
    ("later no reuse", "no_reuse", "{:.3f}"),
    ("reuse/oracle", "reuse_oracle", "{:.3f}"),
    ("later TTFT p50 / p90 s", "ttft", "{}"),
    ("fallbacks / told home", "router", "{}"),
    ("pulls: pulled / nothing / failed / missing / no room", "outcomes", "{}"),
    ("pulled ktok", "pulled_tokens", "{:.0f}"),
    ("drain flushed blocks", "flushed", "{:.0f}"),
    ("blocks sent by the leaving rank", "sent_leaving", "{:.0f}"),
    ("errors", "errors", "{}"),
)


def table(rows: Sequence[dict]) -> str:
    lines = ["| " + " | ".join(title for title, _, _ in COLUMNS) + " |"]
    lines.append("|" + "---|" * len(COLUMNS))
    for row in rows:
        cells = {
            **row,
            "moved_recomputed": row["moved_recomputed"] / 1000,
            "moved_prompt": row["moved_prompt"] / 1000,
            "ttft": f"{row['ttft_p50']:.2f} / {row['ttft_p90']:.2f}",
            "router": f"{row['fallbacks']:.0f} / {row['kv_moves']:.0f}",
            "outcomes": " / ".join(f"{row['outcomes'][o]:.0f}" for o in OUTCOMES),
            "pulled_tokens": row["pulled_tokens"] / 1000,
        }
        lines.append("| " + " | ".join(fmt.format(cells[key]) for _, key, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", type=Path, default=TRACES)
    p.add_argument("--sessions", type=int, default=6, help="sessions replayed, all at once")
    p.add_argument("--max-turns", type=int, default=None, help="first N turns of each session")
    p.add_argument("--model", default="8b")
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--slots", type=int, default=1, help="slots per rank")
    p.add_argument("--sim-time-scale", type=float, default=1.0, help="factor on step sleeps")
    p.add_argument("--time-scale", type=float, default=0.05, help="factor on think times")
    p.add_argument("--stagger", type=float, default=2.0, help="seconds between session starts")
    p.add_argument("--max-wait-seconds", type=float, default=30.0, help="strict wait bound")
    p.add_argument("--drain-rank", default="rank-0")
    p.add_argument("--drain-at", type=float, default=30.0, help="seconds into the replay")
    p.add_argument("--drain-seconds", type=float, default=600.0, help="its drain window")
    p.add_argument(
        "--drain-linger-seconds",
        type=float,
        default=0.0,
        help="the drained rank serves pulls this long after its last stream",
    )
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    max_len = preset(args.model).max_position
    files = report_half(args.traces, args.sessions, max_len)
    conversations = filter_max_model_len(read_traces(files, ReadOptions()), max_len)
    if args.max_turns:
        conversations = first_turns(conversations, args.max_turns)
    requests = sum(c.request_count() for c in conversations)
    print(f"{len(files)} sessions ({', '.join(f.stem for f in files)}), {requests} requests; "
          f"{args.ranks} ranks x {args.slots} slots, {args.model} sim x {args.sim_time_scale}, "
          f"think x {args.time_scale}; {args.drain_rank} drains at {args.drain_at:g} s, "
          f"lingers {args.drain_linger_seconds:g} s",
          flush=True)  # fmt: skip
    rows = []
    for name in args.arms.split(","):
        rows.append(run_one(args, name, conversations))
        print(f"{name}: {rows[-1]['wall_s']:.0f} s, {rows[-1]['requests']} requests", flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
