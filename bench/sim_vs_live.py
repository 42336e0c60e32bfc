"""Does the simulator's prefix reuse agree with a live run of the same arm?

Each arm replays the same Mooncake slice twice: on the simulator (`--target sim`, the tiny
CPU model's figures in bench/sim_tiny_cpu.yaml) and on its live twin, an embedded fleet of
CPU engine ranks with the tiny model whose router and kvstore are configured like the arm
(services/replay/live_twin.py proves the kvstore configs equal). Prints one table: sim and live
prefix reuse, the difference in points, and later turns with no reuse both ways.

    .venv/bin/python bench/sim_vs_live.py      # 80-160 s on the 2-core dev machine
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.sim_config import SimConfig, load_sim_config
from kvfleet.services.replay.tokens import TokenSynthesizer
from kvfleet.services.replay.twin_compare import (
    ArmComparison,
    Workload,
    compare_arm,
    multi_turn_slice,
)

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
SIM_FILE = HERE / "sim_tiny_cpu.yaml"

# What every arm shares: 2 ranks x 2 slots, 16-token pages, one 4096-token step budget (so a
# window pool can hold any prompt the engine accepts), 800 pages per rank (~2.8 slice
# conversations' prompts on the full-attention pool).
FLEET = {
    "ranks": "2",
    "slots": "2",
    "block_size": "16",
    "gpu_pages": "800",
    "chunk_tokens": "4096",
    "max_context_tokens": "4096",
    "retained_conversations": "2",
    "max_wait_passes": "1000000",
    "max_wait_seconds": "2.0",
}

ARMS = {
    "lenient, per_conversation(2), ckpt": {
        "affinity": "lenient",
        "reuse_policy": "per_conversation",
        "max_num_turns": "2",
        "checkpoint": "true",
    },
    "strict, per_conversation(2), ckpt": {
        "affinity": "strict",
        "reuse_policy": "per_conversation",
        "max_num_turns": "2",
        "checkpoint": "true",
    },
}


def arm_config(arm: dict[str, str], gpu_pages: int) -> SimConfig:
    """The simulator config of one arm."""
    return load_sim_config(SIM_FILE, {**FLEET, "gpu_pages": str(gpu_pages), **arm})


def print_table(rows: list[ArmComparison], seconds: list[float]) -> None:
    """The comparison as a markdown table."""
    print(
        "| arm | sim reuse | live reuse | difference (points) | oracle (sim / live) "
        "| later no reuse sim | later no reuse live | difference (points) | requests | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row, wall in zip(rows, seconds, strict=True):
        sim, live = row.sim, row.live
        print(
            f"| {row.name} | {sim.prefix_reuse:.3f} | {live.prefix_reuse:.3f} "
            f"| {row.reuse_difference_points:+.1f} "
            f"| {sim.oracle_reuse:.3f} / {live.oracle_reuse:.3f} "
            f"| {sim.later_turns_no_reuse:.3f} | {live.later_turns_no_reuse:.3f} "
            f"| {row.no_reuse_difference_points:+.1f} | {sim.requests} / {live.requests} "
            f"| {wall:.0f} |"
        )


def print_disagreements(row: ArmComparison) -> None:
    """How many turns reused differently, and the tokens each side reused on them."""
    found = row.turn_disagreements()
    sim_more = sum(1 for d in found if d.sim_reused > d.live_reused)
    print(
        f"{row.name}: {len(found)} of {row.sim.requests} turns reused differently "
        f"(sim more on {sim_more}, live more on {len(found) - sim_more}); "
        f"tokens reused on them: sim {sum(d.sim_reused for d in found):,}, "
        f"live {sum(d.live_reused for d in found):,}"
    )
    for item in found[:8]:
        print(
            f"  {item.conversation_id} turn {item.turn_index}: prompt {item.prompt_tokens}, "
            f"sim {item.sim_reused}, live {item.live_reused}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--min-turns", type=int, default=4)
    parser.add_argument("--gpu-pages", type=int, default=int(FLEET["gpu_pages"]))
    parser.add_argument("--time-scale", type=float, default=0.005, help="think-time factor")
    parser.add_argument("--stagger", type=float, default=0.25, help="seconds between sessions")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    model = preset("tiny")
    conversations = multi_turn_slice(TRACE, model.max_position, args.min_turns, args.conversations)
    turns = sum(c.request_count() for c in conversations)
    workload = Workload(
        conversations,
        TokenSynthesizer(args.seed, model.vocab_size),
        DriverOptions(len(conversations), args.time_scale, args.stagger),
    )
    print(
        f"slice: {len(conversations)} conversations, {turns} turns of {TRACE.name} under "
        f"{model.max_position} tokens; think x {args.time_scale}, all sessions concurrent, "
        f"{args.stagger} s apart; fleet {FLEET['ranks']} ranks x {FLEET['slots']} slots, "
        f"{args.gpu_pages} pages/rank of {FLEET['block_size']} tokens"
    )
    rows, seconds = [], []
    for name, arm in ARMS.items():
        start = time.perf_counter()
        rows.append(compare_arm(name, arm_config(arm, args.gpu_pages), workload))
        seconds.append(time.perf_counter() - start)
    print_table(rows, seconds)
    for row in rows:
        print_disagreements(row)


if __name__ == "__main__":
    main()
