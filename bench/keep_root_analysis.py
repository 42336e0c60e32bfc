"""Which retention would rescue the later turns that reuse nothing under a window model?

An unbounded-cache count on Claude Code sessions (no fleet, no timing): a later turn can
resume at a position p only if every full block before p is cached (always, here) and the
window ending at p was kept, i.e. p lies in [checkpoint, endpoint] of a retained turn (the
two kept windows overlap), or p is a kept branch point. Reuse also stops R tokens before the
prompt end. Counts the later turns whose reuse is under 2 % of the prompt, for:

- last N turns (today's per_conversation(max_num_turns=N)),
- + root (keep_root=True: the first turn's endpoint and checkpoint),
- + branch points (a turn whose full-attention match runs past its window match also keeps the
  window ending there, for the conversation's life): built as `kvfleet.kvstore.branch_points`
  (`keep_branch_points=n` keeps n per conversation); this counts the ideal (every branch kept,
  no checkpoint-distance rule), docs/kvstore.md has the simulator's figures.

Run: .venv/bin/python bench/keep_root_analysis.py [--sessions 12] [--turns 5] [--details]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from kvfleet.services.replay.readers import ReadOptions, filter_max_model_len, read_traces

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "claude_code_weka"
NO_REUSE_FRACTION = 0.02


@dataclass(frozen=True)
class WindowModel:
    """Block size, window, replay R and checkpoint margin of bench/sim_hybrid.yaml."""

    block_size: int = 64
    window_blocks: int = 64
    replay_tokens: int = 512
    margin_tokens: int = 512

    def kept_range(self, prompt_len: int) -> tuple[int, int]:
        """Blocks [checkpoint, endpoint] a retained turn can be resumed anywhere in."""
        end = prompt_len // self.block_size
        checkpoint = max(0, prompt_len - self.replay_tokens - self.margin_tokens)
        return checkpoint // self.block_size, end

    def cap(self, prompt_len: int) -> int:
        return max(0, prompt_len - self.replay_tokens) // self.block_size


@dataclass
class History:
    """What one conversation has kept so far: (checkpoint, endpoint, keys) per turn, branches."""

    turns: list[tuple[int, int, list]] = field(default_factory=list)
    branches: list[tuple[int, list]] = field(default_factory=list)


def shared(a: list, b: list) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def resumable(keys: list, cap: int, kept: list[tuple[int, int, list]]) -> int:
    """The furthest block a turn can resume at from these kept turns."""
    best = 0
    for checkpoint, end, other in kept:
        common = min(shared(keys, other), cap)
        if common >= end:
            best = max(best, end)
        elif common >= checkpoint:
            best = max(best, common)
    return best


def count(conversations, model: WindowModel, turns: int, details: bool) -> dict[str, int]:
    """Later turns, and those reusing nothing per retention."""
    counts = {"later turns": 0, "last N": 0, "+ root": 0, "+ root + branch points": 0}
    for conversation in conversations:
        for agent in conversation.all_conversations():
            history = History()
            for index, turn in enumerate(agent.turns()):
                keys, cap = list(turn.block_keys()), model.cap(turn.input_tokens)
                if index:
                    counts["later turns"] += 1
                    last = resumable(keys, cap, history.turns[-turns:])
                    root = max(last, resumable(keys, cap, history.turns[:1]))
                    branch = max(
                        [root]
                        + [b for b, other in history.branches if shared(keys, other) >= b <= cap]
                    )
                    full = min(max(shared(keys, k) for *_, k in history.turns), cap)
                    limit = NO_REUSE_FRACTION * turn.input_tokens
                    for name, blocks in (
                        ("last N", last),
                        ("+ root", root),
                        ("+ root + branch points", branch),
                    ):
                        counts[name] += blocks * model.block_size < limit
                    if details and root * model.block_size < limit:
                        checkpoint, end = model.kept_range(agent_first(agent).input_tokens)
                        print(
                            f"{agent.conversation_id} turn {index}: shares {full} blocks at most, "
                            f"first turn kept [{checkpoint}, {end}]"
                        )
                    if full > branch:
                        history.branches.append((full, keys))
                history.turns.append((*model.kept_range(turn.input_tokens), keys))
    return counts


def agent_first(agent):
    return next(agent.turns())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--turns", type=int, default=5, help="max_num_turns")
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--details", action="store_true", help="print each unrescued turn")
    args = parser.parse_args()
    files = sorted(TRACES.glob("trace_*.json"))[: args.sessions]
    conversations = filter_max_model_len(read_traces(files, ReadOptions()), args.max_model_len)
    counts = count(conversations, WindowModel(), args.turns, args.details)
    later = counts.pop("later turns")
    print(f"{later} later turns, unbounded cache, window model of bench/sim_hybrid.yaml")
    print(f"{'retention':<26}{'no reuse':>10}{'share':>9}{'vs last N':>11}")
    for name, value in counts.items():
        ratio = f"{value / counts['last N']:.2f}x" if counts["last N"] else "-"
        print(f"{name:<26}{value:>10}{value / later:>9.2%}{ratio:>11}")


if __name__ == "__main__":
    main()
