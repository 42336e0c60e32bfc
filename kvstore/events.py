"""KV events: what a pool tells listeners when a block becomes findable or stops being so.

The engine forwards them to the router (no RPC types here); ids are the chained block hashes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class KVEventKind(StrEnum):
    STORED = "stored"
    REMOVED = "removed"


@dataclass(frozen=True)
class KVEvent:
    """A block id was committed to (`stored`) or evicted/dropped from (`removed`) a pool."""

    kind: KVEventKind
    life_cycle: str
    block_hash: int


KVEventListener = Callable[[KVEvent], None]


def ignore_event(event: KVEvent) -> None:
    """The default listener: nobody forwards events."""
