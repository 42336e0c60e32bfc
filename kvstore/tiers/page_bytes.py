"""Moving page bytes between tiers: the protocol the tier stack calls, and its byte-less form.

The stack decides what moves where and in which order; a `TierBytes` only copies. A *row* is
one block's bytes in host memory: a host-tier slot or a page of a staging buffer that a disk
file was read into. `NoBytes` lets the fleet simulator drive the same stack with no tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class TierBytes(Protocol):
    """Copies between device pages, host rows and disk payloads."""

    def offload(
        self, life_cycle: str, device_pages: Sequence[int], host_slots: Sequence[int]
    ) -> None:
        """Copy device pages to host slots, before anything later overwrites those pages."""

    def onboard(self, life_cycle: str, device_pages: Sequence[int], rows: Sequence[Any]) -> None:
        """Copy host rows into device pages; the compute stream waits for them, the CPU not."""

    def download(self, life_cycle: str, device_pages: Sequence[int], rows: Sequence[Any]) -> None:
        """Copy device pages into rows (a draining rank's disk writes); the pages stay unchanged."""

    def host_row(self, life_cycle: str, slot: int) -> Any:
        """The row of one host slot."""

    def new_rows(self, life_cycle: str, num_rows: int) -> list[Any]:
        """Fresh staging rows to read disk files into."""

    def payload(self, row: Any) -> memoryview | None:
        """The row's bytes for the CPU (disk read or write), once copies touching it are done."""

    def fill_row(self, row: Any, data: bytes | bytearray) -> None:
        """Overwrite a row with one block's bytes (a prefetched disk file)."""

    def synchronize(self) -> None:
        """Wait for every copy launched so far."""


class NoBytes:
    """No tensors: the simulator's stack moves nothing and charges copy time from its model."""

    def offload(self, life_cycle, device_pages, host_slots) -> None:
        """Nothing to copy."""

    def onboard(self, life_cycle, device_pages, rows) -> None:
        """Nothing to copy."""

    def download(self, life_cycle, device_pages, rows) -> None:
        """Nothing to copy."""

    def host_row(self, life_cycle, slot) -> None:
        """No row."""

    def new_rows(self, life_cycle, num_rows) -> list[None]:
        """No rows."""
        return [None] * num_rows

    def payload(self, row) -> None:
        """No bytes."""

    def fill_row(self, row, data) -> None:
        """Nothing to fill."""

    def synchronize(self) -> None:
        """Nothing in flight."""
