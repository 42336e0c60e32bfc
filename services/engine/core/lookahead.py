"""One decode step in flight while the host schedules the next (the engine core's overlap).

After a greedy decode step is launched, its sequences get a PENDING placeholder token, so the
scheduler can plan the next step (one more token each, pages included) while the device still
computes; that next step takes the pending tokens straight from the device (`feed_rows`), and
the host learns them, and emits them, while the next step runs. The core looks ahead only where
planning cannot depend on the tokens: a page for the next token of every sequence in flight (no
preemption, no release of retained turns for them), those sequences first in the running order,
none constrained by a grammar (its next mask needs the token), none reaching max_tokens with its
pending token, and no command queued (a cancel or a call on the core sees settled state). A
stop token is learnt one step late: that sequence's row of the next step is computed and
dropped.

Requests waiting at the rank, and running ones out of the step in flight (a prefill short of
pages), are planned ahead as they would be after the tokens: neither reads a token of a
sequence in flight, and those come first in the running order, so room made for the others
never preempts one of them. The only difference is a sequence that ends on its pending token: it
still holds its slot and pages while the plan is made, so a prefill that needed them comes one
step later. A step with a prefill cannot take its inputs from the device, so the core reads the
tokens in flight before launching it, and `settle` fills in the plan's pending inputs and drops
the sequences that ended. Before this, a rank with a request waiting for room or a slot read
every step's tokens before planning the next: each decode step paid its host work after the
chip time, and on a chip shared by several ranks it waited for the chip again after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

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
    """Whether planning the next step now gives the plan made after the tokens are known, but
    for a sequence that ends on its pending token (its slot and pages are free a step later)."""
    if commands_waiting:
        return False
    pending = inflight.rows
    running = scheduler.running
    in_flight = len(pending)
    if len(running) < in_flight:
        return False
    for position, s in enumerate(running):  # one pass: this runs for every sequence at every step
        sampling = s.sampling
        # The step in flight's sequences come first: the plan grows them before any other, so
        # making room for another never preempts one (its pending token unknown).
        # (a constrained sequence is never plain greedy: its next mask needs its token)
        if (
            (id(s) in pending) != (position < in_flight)
            or not sampling.plain_greedy
            or len(s.output) >= sampling.max_tokens
        ):
            return False
    # The next token of each sequence in flight fits: growing them never releases or preempts
    # anything. (Most land in a page they hold: count those that need one only when short.)
    if all(pool.num_available() >= in_flight for pool in manager.pools.values()):
        return True
    return manager.can_allocate_all([s.key for s in running[:in_flight]], 1)


def settle(chunks: Sequence) -> list:
    """A plan made ahead, once the tokens in flight are known: a chunk whose sequence ended is
    dropped (its pages went with it), and a pending input is replaced by its token."""
    settled = []
    for chunk in chunks:
        sequence = chunk.sequence
        if sequence.finished:
            continue
        if PENDING in chunk.new_tokens:
            end = chunk.start + len(chunk.new_tokens)
            chunk = replace(chunk, new_tokens=tuple(sequence.tokens(chunk.start, end)))
        settled.append(chunk)
    return settled
