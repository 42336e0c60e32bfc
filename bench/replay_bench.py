"""Benchmark: the replay tool's own costs, so that it never is the bottleneck of a replay.

Measured in one run, each against a straightforward baseline:
- token synthesis of Claude Code prompts (vectorised per-block hashing vs one `random.Random`
  per block),
- the oracle over a session (trie of int pairs vs a set of every prefix as a tuple),
- the load driver's overhead per request against an instant in-process target (8 sessions vs
  a plain loop that awaits each request in turn).
Run: .venv/bin/python bench/replay_bench.py
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace
from pathlib import Path

from kvfleet.services.replay.claude_code import read_claude_code
from kvfleet.services.replay.driver import DriverOptions, LoadDriver
from kvfleet.services.replay.model import Turn
from kvfleet.services.replay.oracle import summarise
from kvfleet.services.replay.records import Generation
from kvfleet.services.replay.target_types import TargetInfo, WallClock
from kvfleet.services.replay.tokens import TokenSynthesizer
from rich.console import Console
from rich.table import Table

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "claude_code_weka"
VOCAB = 32000


def naive_tokens(seed: int, turn: Turn) -> list[int]:
    """One seeded `random.Random` per block, then a per-turn tail."""
    tokens: list[int] = []
    for namespace, block_id in turn.block_keys():
        rng = random.Random(f"{seed}/{namespace}/{block_id}")
        tokens += [rng.randrange(VOCAB) for _ in range(turn.block_size)]
    rng = random.Random(f"{seed}/tail/{turn.index}")
    tokens += [rng.randrange(VOCAB) for _ in range(turn.input_tokens - len(tokens))]
    return tokens[: turn.input_tokens]


def naive_oracle(turns: list[Turn]) -> float:
    """The README's rule with a set of every prefix, as tuples."""
    seen: set[tuple[int, ...]] = set()
    reused = total = 0
    for turn in turns:
        ids = turn.hash_ids
        length = 0
        while length < len(ids) and ids[: length + 1] in seen:
            length += 1
        reused += length
        total += len(ids)
        seen.update(ids[: end + 1] for end in range(len(ids)))
    return reused / total


class InstantTarget:
    """Answers at once with one token; measures only the driver."""

    def __init__(self) -> None:
        self.clock = WallClock()

    async def describe(self) -> TargetInfo:
        return TargetInfo()

    async def generate(self, conversation_id: str, tokens: list[int], max_tokens: int, hints=()):
        now = self.clock.now()
        return Generation(len(tokens), 0, 1, now, (now,), now)

    async def aclose(self) -> None:
        return None


def timed(function, *args) -> tuple[float, object]:
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


async def plain_loop(target: InstantTarget, synth: TokenSynthesizer, conversations) -> None:
    for conversation in conversations:
        for turn in conversation.turns():
            await target.generate("c", synth.turn_tokens("c", turn), 1)


def main() -> None:
    session = read_claude_code(TRACES / "trace_0291.json")
    turns = list(session.turns())[:20]
    synth = TokenSynthesizer(0, VOCAB)
    tokens = sum(t.input_tokens for t in turns)
    rows = []

    fast, _ = timed(lambda: [synth.turn_tokens("c", t) for t in turns])
    slow, _ = timed(lambda: [naive_tokens(0, t) for t in turns])
    rows.append(("token synthesis", f"{tokens / fast / 1e6:.1f} M tok/s",
                 f"{tokens / slow / 1e6:.2f} M tok/s", slow / fast))  # fmt: skip

    blocks = sum(len(t.hash_ids) for t in turns)
    fast, fast_reuse = timed(lambda: summarise(turns).block_reuse)
    slow, slow_reuse = timed(naive_oracle, turns)
    assert fast_reuse == slow_reuse, (fast_reuse, slow_reuse)
    rows.append(("oracle", f"{blocks / fast / 1e6:.2f} M blocks/s",
                 f"{blocks / slow / 1e6:.3f} M blocks/s", slow / fast))  # fmt: skip

    # Small prompts so that the driver's own work dominates.
    small = [
        replace(session, steps=tuple(replace(t, input_tokens=64, hash_ids=t.hash_ids[:1])
                                     for t in session.turns()))
        for _ in range(8)
    ]  # fmt: skip
    small = [replace(c, conversation_id=f"c{i}") for i, c in enumerate(small)]
    requests = sum(c.request_count() for c in small)
    target = InstantTarget()
    driver = LoadDriver(target, synth, DriverOptions(8, 0.0, 0.0))
    fast, _ = timed(asyncio.run, driver.run(small))
    base, _ = timed(asyncio.run, plain_loop(target, synth, small))
    rows.append(("driver overhead", f"{fast / requests * 1e6:.0f} us/req",
                 f"{base / requests * 1e6:.0f} us/req", base / fast))  # fmt: skip

    table = Table(title="kvfleet replay: tool costs (higher ratio = faster than baseline)")
    for column in ("what", "replay", "baseline", "baseline time / replay time"):
        table.add_column(column, justify="right" if column != "what" else "left")
    for what, ours, theirs, ratio in rows:
        table.add_row(what, ours, theirs, f"{ratio:.2f}x")
    Console().print(table)
    print(f"workload: first {len(turns)} turns of trace_0291 ({tokens:,} tokens, {blocks:,} "
          f"blocks); driver: 8 x {requests // 8} requests")  # fmt: skip


if __name__ == "__main__":
    main()
