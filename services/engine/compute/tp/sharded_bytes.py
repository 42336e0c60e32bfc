"""The leader's tier bytes: it copies its own KV shard and has every worker copy the same
pages and slots of theirs, so a host-tier block holds every worker's shard (each in that
worker's host memory, under the same slot).

Disk files and hand-off pulls take whole rows on the leader; they are not sharded yet, so a
tensor-parallel rank runs with no disk tier (see `EngineConfig.tensor_parallel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .step_plan import OFFLOAD, ONBOARD, send_to_workers


class ShardedBytes:
    """A `TierBytes` over the leader's `TorchBytes`, mirrored on the workers."""

    def __init__(self, local: Any) -> None:
        self.local = local
        self.kv = local.kv
        self.layout = local.layout

    def offload(self, life_cycle: str, device_pages: Sequence[int], host_slots: Sequence[int]):
        send_to_workers((OFFLOAD, life_cycle, list(device_pages), list(host_slots)))
        self.local.offload(life_cycle, device_pages, host_slots)

    def onboard(self, life_cycle: str, device_pages: Sequence[int], rows: Sequence[Any]) -> None:
        slots = [self._slot(life_cycle, row) for row in rows]
        send_to_workers((ONBOARD, life_cycle, list(device_pages), slots))
        self.local.onboard(life_cycle, device_pages, rows)

    def download(self, life_cycle: str, device_pages: Sequence[int], rows: Sequence[Any]) -> None:
        raise NotImplementedError("tensor_parallel > 1: disk writes of KV shards are not supported")

    def host_row(self, life_cycle: str, slot: int) -> torch.Tensor:
        return self.local.host_row(life_cycle, slot)

    def new_rows(self, life_cycle: str, num_rows: int) -> list[torch.Tensor]:
        return self.local.new_rows(life_cycle, num_rows)

    def payload(self, row: torch.Tensor) -> memoryview:
        return self.local.payload(row)

    def fill_row(self, row: torch.Tensor, data: bytes | bytearray) -> None:
        self.local.fill_row(row, data)

    def synchronize(self) -> None:
        self.local.synchronize()

    def _slot(self, life_cycle: str, row: torch.Tensor) -> int:
        """The host slot `row` is a view of; a staging row (a disk read) is refused."""
        try:
            first = self.local.host_row(life_cycle, 0)
        except IndexError:  # no host tier
            first = None
        same = first is not None and (
            row.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        )
        if not same:
            raise NotImplementedError(
                "tensor_parallel > 1 onboards from host-tier rows only (disk reads are not sharded)"
            )
        return (row.data_ptr() - first.data_ptr()) // row.nbytes
