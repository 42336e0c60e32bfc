"""Which page-table entries changed since a reader last asked: the manager's delta record.

A reader that keeps its own copy of every request's page tables (the engine's persistent
device tables) asks for the changes once per step instead of copying whole tables. The manager
is the only writer: it notes each span of entries it touched (`touched`) and each request it
forgot (`ended`); `take` hands out the spans' current values and starts a new record.

Spans are read at `take`, so an entry touched twice reads once, with its latest value. A
request that ended and was admitted again before `take` (a preemption and its resume) is in
both `ended` and `spans`: the reader forgets the old tables first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .request_state import RequestState


@dataclass(frozen=True)
class TableSpan:
    """Entries `first .. first + len(pages) - 1` of one request's page table of one life cycle."""

    request_id: str
    life_cycle: str
    first: int
    pages: tuple[int, ...]


@dataclass(frozen=True)
class TableDelta:
    """What changed since the last `take`: requests forgotten, then spans to (re)write."""

    ended: tuple[str, ...]
    spans: tuple[TableSpan, ...]


class TableChanges:
    """The record itself; written by the manager only."""

    def __init__(self) -> None:
        self._spans: dict[str, dict[str, list[tuple[int, int]]]] = {}
        self._ended: dict[str, None] = {}  # insertion-ordered set

    def touched(self, request_id: str, life_cycle: str, first: int, end: int) -> None:
        """Entries [first, end) of the request's table of `life_cycle` may have changed."""
        if end > first:
            spans = self._spans.setdefault(request_id, {}).setdefault(life_cycle, [])
            if spans and spans[-1][1] == first:  # a table growing step by step: one span
                spans[-1] = (spans[-1][0], end)
            else:
                spans.append((first, end))

    def replaced(self, state: RequestState) -> None:
        """Every table of the request is new (an admission)."""
        for name, table in state.page_tables.items():
            self._spans.setdefault(state.request_id, {})[name] = [(0, len(table))]

    def ended(self, request_id: str) -> None:
        """The request is forgotten: its tables are gone."""
        self._spans.pop(request_id, None)
        self._ended[request_id] = None

    def take(self, requests: Mapping[str, RequestState]) -> TableDelta:
        """The changes since the last call, read from `requests` now; the record starts over."""
        spans = []
        for request_id, by_life_cycle in self._spans.items():
            tables = requests[request_id].page_tables
            for name, ranges in by_life_cycle.items():
                table = tables[name]
                for first, end in ranges:
                    pages = tuple(table[first:end])
                    if pages:
                        spans.append(TableSpan(request_id, name, first, pages))
        delta = TableDelta(tuple(self._ended), tuple(spans))
        self._spans, self._ended = {}, {}
        return delta
