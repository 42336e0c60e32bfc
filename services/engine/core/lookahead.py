"""One decode step in flight while the host schedules the next (the engine core's overlap).

After a greedy decode step is launched, its sequences get a PENDING placeholder token, so the
scheduler can plan the next step (one more token each, pages included) while the device still
computes; that next step takes the pending tokens straight from the device (`feed_rows`), and
the host learns them, and emits them, while the next step runs. The core looks ahead only where
planning cannot depend on the tokens: no request waiting (no admission), pages free for every
running sequence (no preemption, no release of retained turns), every running sequence in the
step in flight, none constrained by a grammar (its next mask needs the token), none reaching
max_tokens with its pending token, and no command queued (a cancel or a call on the core sees
settled state). A stop token is learnt one step late: that sequence's row of the next step is
computed and dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

PENDING = -1  # a sampled token that is still on the device


@dataclass
class InflightStep:
    """A launched step whose tokens the host has not read yet."""

    chunks: list
    finish: Callable[[], list[int | None]]
    indices: list[int | None]  # where each chunk's pending token sits in its sequence's output
    rows: dict[int, int]  # id of each sequence with a pending token -> its row (chunk)

    @property
    def device_tokens(self):
        return getattr(self.finish, "device_tokens", None)


def mark_pending(chunks: Sequence, finish) -> InflightStep:
    """Give each sampling chunk's sequence a PENDING token and keep the step in flight."""
    indices: list[int | None] = []
    rows: dict[int, int] = {}
    for row, chunk in enumerate(chunks):
        sequence = chunk.sequence
        if chunk.samples and not sequence.finished:
            indices.append(len(sequence.output))
            sequence.output.append(PENDING)
            rows[id(sequence)] = row
        else:
            indices.append(None)
    return InflightStep(list(chunks), finish, indices, rows)


def feed_rows(chunks: Sequence, inflight: InflightStep) -> list[int]:
    """For each chunk of the next step, the row of the step in flight whose device token is
    its input (-1: its token is known on the host)."""
    rows = inflight.rows
    return [rows.get(id(c.sequence), -1) if c.new_tokens[-1] == PENDING else -1 for c in chunks]


def can_look_ahead(inflight: InflightStep, scheduler, manager, commands_waiting: bool) -> bool:
    """Whether planning the next step now gives the same plan as after the tokens are known."""
    if commands_waiting or scheduler.waiting:
        return False
    pending = inflight.rows
    running = scheduler.running
    if len(running) != len(pending):
        return False
    for s in running:  # one pass: this runs for every sequence at every step
        sampling = s.sampling
        # (a constrained sequence is never plain greedy: its next mask needs its token)
        if (
            id(s) not in pending
            or not sampling.plain_greedy
            or len(s.output) >= sampling.max_tokens
        ):
            return False
    return all(pool.num_available() >= len(running) for pool in manager.pools.values())
