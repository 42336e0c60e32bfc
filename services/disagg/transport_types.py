"""What a hand-off transport is: the request it serves, its interface, what it is built from.

The registry (`transports.py`) and every transport (`grpc_pull.py`, `disk_handoff.py`) import
these; the registry imports the transports, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ...kvstore.tiers.layout import KVLayout
from .blocks import KVBlock


class TransportError(RuntimeError):
    """A transport could not deliver (source gone, timeout, bad bytes, nothing on disk)."""


@dataclass(frozen=True)
class FetchRequest:
    """What the receiver asks for: blocks after the prefix it holds, per life cycle.

    `wanted[lc]` lists `(index, block_hash)` of every block the receiver would take (hash 0:
    the partial last block); `held_hashes` are the chained hashes of the prefix it holds;
    `contents[index]` is what a full block's shared disk file must hold (disk_files.py).
    `prompt` set: a moved turn's prefix, asked of its home by prompt (`prefix_pull.py`), not a
    parked request's KV.
    """

    request_id: str
    source_address: str
    held_hashes: tuple[int, ...]
    wanted: Mapping[str, tuple[tuple[int, int], ...]]
    timeout_seconds: float
    contents: Mapping[int, bytes] = field(default_factory=dict)
    prompt: tuple[int, ...] = ()
    cache_salt: str = ""


class HandoffTransport(Protocol):
    name: str

    def fetch(self, request: FetchRequest) -> list[KVBlock]:
        """The blocks this transport could get; raises TransportError when it got nothing."""

    def done(self, request: FetchRequest) -> None:
        """The hand-off completed (by any transport): drop what was kept only for it."""

    def close(self) -> None:
        """Release connections."""


@dataclass(frozen=True)
class TransportContext:
    """What a transport may need: the life cycles in wire order, the page layout, the disk."""

    life_cycles: tuple[str, ...]
    layout: KVLayout
    disk_dir: str = ""
    options: Mapping[str, object] = field(default_factory=dict)


# A factory returns None when the rank cannot use the transport (no disk tier configured).
TransportFactory = Callable[[TransportContext], "HandoffTransport | None"]
