"""Small frozen results the manager hands out; callers never see its mutable state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixMatch:
    """The longest prefix every required life cycle can resume from.

    `pages[life_cycle]` has one entry per reused block in token order; NULL_PAGE marks positions
    that life cycle does not need (slid out of a window, between state snapshots, private).
    """

    num_reusable_tokens: int
    num_reusable_blocks: int
    pages: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class Allocation:
    """Pages added to a request's page tables by one `admit`/`allocate` call."""

    request_id: str
    num_reused_tokens: int
    num_tokens_with_pages: int
    new_pages: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class TurnRecord:
    """The pages a finished turn's context keeps for its conversation (None: missing page)."""

    conversation_id: str
    request_id: str
    pages: Mapping[str, tuple[int | None, ...]]


@dataclass(frozen=True)
class DropPlan:
    """Pages a retained turn gives up and that go back to the free list (nobody else holds them).

    `released` is every page the turn held; `dropped` the subset freed outright.
    """

    conversation_id: str
    request_id: str
    released: Mapping[str, tuple[int, ...]]
    dropped: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class RequestProgress:
    """A request's reused and computed tokens, its planned checkpoint (None: none)."""

    admitted: bool
    num_reused_tokens: int
    num_computed_tokens: int
    checkpoint_tokens: int | None
    context_done: bool
