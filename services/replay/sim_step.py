"""What one step of a simulated rank is made of: its chunks, their admissions and their work."""

from __future__ import annotations

from dataclasses import dataclass

from ...kvstore.results import Allocation
from ..core.cost_model import StepWork
from .sim_request import SimRequest


@dataclass(frozen=True)
class Chunk:
    """One request's share of a step: tokens [start, start + count)."""

    request: SimRequest
    start: int
    count: int
    host_pages_in: int = 0  # pages onboarded from host / disk at this chunk's admission
    disk_pages_in: int = 0


@dataclass(frozen=True)
class KVAdmission:
    """A prompt admitted into KV after its reusable prefix of `start` tokens."""

    start: int
    allocation: Allocation
    host_pages_in: int  # pages of the match onboarded from host / disk
    disk_pages_in: int


def step_work(chunks: list[Chunk], pieces_in: tuple[int, int] = (0, 0)) -> StepWork:
    """The cost model's view of a step: prefill spans, decode contexts, onboarded pages (the
    chunks' and `pieces_in`, the (host, disk) pages brought up ahead of an admission before
    it)."""
    return StepWork(
        prefill_spans=tuple(
            (c.start, c.start + c.count) for c in chunks if not c.request.context_done
        ),
        decode_contexts=tuple(c.start for c in chunks if c.request.context_done),
        host_pages_in=sum(c.host_pages_in for c in chunks) + pieces_in[0],
        disk_pages_in=sum(c.disk_pages_in for c in chunks) + pieces_in[1],
    )
