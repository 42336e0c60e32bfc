"""Real page bytes: device KV in torch tensors, a host tier in (pinned) host memory, copies
batched on a side CUDA stream.

Ordering (CUDA): every batch first waits for the compute stream (pages it wrote are final),
then copies on the side stream and records an event that the compute stream waits on, so the
next kernel that writes an offloaded page or reads an onboarded one runs after the copy, while
the CPU goes on. Before the CPU touches host memory (disk writes, prefetch fills) it waits for
the last event, since side-stream copies may still read or write those rows. On CPU all of this
is plain synchronous copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch

from .device_kv import DeviceKV, default_device
from .layout import KVLayout

# Pages per batched copy: bounds the transient device buffer of a gather or scatter.
COPY_CHUNK_PAGES = 64
# Integer dtypes copies run in: bits move unchanged, and CPU copies of bf16 views are slow.
BITS_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class TorchBytes:
    """Device KV of the manager's pools, host-tier rows, and the copies between them."""

    def __init__(
        self,
        layout: KVLayout,
        device_pages: Mapping[str, int],
        host_pages: Mapping[str, int],
        device: torch.device | str | None = None,
    ) -> None:
        self.layout = layout
        self.device = torch.device(device) if device is not None else default_device()
        self.kv = DeviceKV(layout, device_pages, self.device)
        self._cuda = self.device.type == "cuda"
        self._host = {
            name: torch.zeros(
                (host_pages.get(name, 0), *layout.page_shape(name)),
                dtype=self.kv.dtype,
                pin_memory=self._cuda,
            )
            for name in layout.layers
        }
        self._stream = torch.cuda.Stream(device=self.device) if self._cuda else None
        self._last_copy: torch.cuda.Event | None = None
        self._bits = BITS_OF_SIZE[self.kv.dtype.itemsize]
        # NOTE: a GPU gathers pages in one kernel and copies them in large runs; a CPU is
        # faster copying page by page (index_select on an inner dim is slow there).
        self.offload = self._offload_batched if self._cuda else self._offload_per_page
        self.onboard = self._onboard_batched if self._cuda else self._onboard_per_page

    def _offload_per_page(
        self, life_cycle: str, device_pages: Sequence[int], host_slots: Sequence[int]
    ) -> None:
        """Copy device pages to host slots, one page at a time (CPU)."""
        pages, host = self._bit_view(life_cycle)
        for page, slot in zip(device_pages, host_slots, strict=True):
            host[slot].copy_(pages[:, :, page])

    def _onboard_per_page(
        self, life_cycle: str, device_pages: Sequence[int], rows: Sequence[torch.Tensor]
    ) -> None:
        """Copy host rows into device pages, one page at a time (CPU)."""
        pages, _ = self._bit_view(life_cycle)
        for page, row in zip(device_pages, rows, strict=True):
            pages[:, :, page].copy_(row.view(self._bits))

    def _bit_view(self, life_cycle: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv.storage(life_cycle).view(self._bits), self._host[life_cycle].view(self._bits)

    def _offload_batched(
        self, life_cycle: str, device_pages: Sequence[int], host_slots: Sequence[int]
    ) -> None:
        """Copy device pages to host slots in batches on the side stream."""
        host = self._host[life_cycle]
        for start in range(0, len(device_pages), COPY_CHUNK_PAGES):
            pages = device_pages[start : start + COPY_CHUNK_PAGES]
            slots = host_slots[start : start + COPY_CHUNK_PAGES]
            with self._side_stream():
                data = self.kv.gather(life_cycle, pages)
                for first, last, slot in _runs(slots):
                    host[slot : slot + last - first].copy_(data[first:last], non_blocking=True)

    def _onboard_batched(
        self, life_cycle: str, device_pages: Sequence[int], rows: Sequence[torch.Tensor]
    ) -> None:
        """Copy host rows into device pages in batches on the side stream."""
        shape = self.layout.page_shape(life_cycle)
        for start in range(0, len(device_pages), COPY_CHUNK_PAGES):
            pages = device_pages[start : start + COPY_CHUNK_PAGES]
            with self._side_stream():
                data = torch.empty((len(pages), *shape), dtype=self.kv.dtype, device=self.device)
                for index, row in enumerate(rows[start : start + COPY_CHUNK_PAGES]):
                    data[index].copy_(row, non_blocking=True)
                self.kv.scatter(life_cycle, pages, data)

    def download(
        self, life_cycle: str, device_pages: Sequence[int], rows: Sequence[torch.Tensor]
    ) -> None:
        """Copy device pages into rows (a draining rank's disk writes); the pages stay unchanged.

        On CUDA the copies run on the side stream; `payload` waits for them before a disk write.
        """
        if not self._cuda:
            pages, _ = self._bit_view(life_cycle)
            for page, row in zip(device_pages, rows, strict=True):
                row.view(self._bits).copy_(pages[:, :, page])
            return
        for start in range(0, len(device_pages), COPY_CHUNK_PAGES):
            end = start + COPY_CHUNK_PAGES
            with self._side_stream():
                data = self.kv.gather(life_cycle, device_pages[start:end])
                for row, page_data in zip(rows[start:end], data, strict=True):
                    row.copy_(page_data, non_blocking=True)

    def host_row(self, life_cycle: str, slot: int) -> torch.Tensor:
        """Host slot `slot` of `life_cycle` (a view)."""
        return self._host[life_cycle][slot]

    def new_rows(self, life_cycle: str, num_rows: int) -> list[torch.Tensor]:
        """Rows of a fresh (pinned on CUDA) staging buffer."""
        shape = self.layout.page_shape(life_cycle)
        buffer = torch.empty((num_rows, *shape), dtype=self.kv.dtype, pin_memory=self._cuda)
        return list(buffer.unbind(0))

    def payload(self, row: torch.Tensor) -> memoryview:
        """The row's bytes, writable, once side-stream copies are done."""
        self.synchronize()
        return row.reshape(-1).view(torch.uint8).numpy().data

    def fill_row(self, row: torch.Tensor, data: bytes | bytearray) -> None:
        """Overwrite a row with one block's bytes."""
        self.payload(row)[:] = data

    def synchronize(self) -> None:
        """Wait for every copy launched so far."""
        if self._last_copy is not None:
            self._last_copy.synchronize()
            self._last_copy = None

    @contextmanager
    def _side_stream(self) -> Iterator[None]:
        if self._stream is None:
            yield
            return
        compute = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(compute)
        with torch.cuda.stream(self._stream):
            yield
        event = torch.cuda.Event()
        event.record(self._stream)
        compute.wait_event(event)
        self._last_copy = event


def _runs(slots: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """`(first, last, slot)` for each run of consecutive slots: rows first..last-1 go to slot+."""
    first = 0
    for index in range(1, len(slots) + 1):
        if index == len(slots) or slots[index] != slots[index - 1] + 1:
            yield first, index, slots[first]
            first = index
