"""Every admitted request's page tables, kept on the device across steps and updated from what
changed (the kvstore manager's delta record, `kvstore/table_changes.py`).

Per layer group one int32 table `[1 + slots, width]` (width: the pages of the longest context),
in the layout the attention backends read; a request holds one row (its slot) from its
admission until the manager forgets it. Row 0 is all null pages: a padded batch's pad rows
point at it. A decode step gathers its rows into the static buffers on the device
(`rows_of` gives them), so the host writes only the entries that changed: a page appended, a
window page slid out, a request admitted (its whole tables) or forgotten (its row cleared).

A numpy mirror of each table stays on the host: the step's slot ids (page of the new token)
are read from it without a device round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from ....kvstore.table_changes import TableDelta

NULL_ROW = 0


class _Staging:
    """A pinned host buffer for one update's cells, and the event after which the device has
    read it (on CPU: a plain buffer, read at once)."""

    def __init__(self, device: torch.device) -> None:
        self._pin = device.type == "cuda"
        self._buffer = torch.empty(0, dtype=torch.int64)
        self._event = torch.cuda.Event() if self._pin else None
        self._pending = False

    def hold(self, size: int) -> torch.Tensor:
        if self._pending:
            self._event.synchronize()
            self._pending = False
        if self._buffer.numel() < size:
            size = max(size, 2 * self._buffer.numel(), 1024)
            self._buffer = torch.empty(size, dtype=torch.int64, pin_memory=self._pin)
        return self._buffer[:size]

    def copied(self) -> None:
        if self._event is not None:
            self._event.record()
            self._pending = True


class PersistentPageTables:
    """Device page tables of every admitted request, one row each, updated from deltas."""

    def __init__(
        self,
        groups: Iterable[str],
        width: int,
        slots: int,
        null_page: int,
        device: torch.device,
        read_changes: Callable[[], TableDelta],
    ) -> None:
        self.groups = tuple(groups)
        self.width, self.null_page, self.device = width, null_page, device
        self._read_changes = read_changes
        self.host: dict[str, np.ndarray] = {}
        self.device_tables: dict[str, torch.Tensor] = {}
        self._slot_of: dict[str, int] = {}
        self._free: list[int] = []
        self._used = np.zeros(1, dtype=np.int64)  # per row: columns that may hold a page
        self._grow(max(1, slots))
        self._staging = [_Staging(device), _Staging(device)]

    @property
    def slots(self) -> int:
        return len(self._used) - 1

    def rows_of(self, request_ids: Sequence[str]) -> np.ndarray:
        """The rows of `request_ids` (int64); KeyError for one the manager never admitted."""
        slot_of = self._slot_of
        return np.fromiter((slot_of[r] for r in request_ids), np.int64, len(request_ids))

    def update(self) -> int:
        """Apply the manager's changes since the last update to the host mirror and queue them
        to the device tables; returns the entries written."""
        delta = self._read_changes()
        if not delta.ended and not delta.spans:
            return 0
        dirty: dict[str, list[tuple[int, int, int]]] = {group: [] for group in self.groups}
        for request_id in delta.ended:
            row = self._slot_of.pop(request_id, None)
            if row is None:
                continue
            used = int(self._used[row])
            for group in self.groups:
                self.host[group][row, :used] = self.null_page
                dirty[group].append((row, 0, used))
            self._used[row] = 0
            self._free.append(row)
        for span in delta.spans:
            row = self._slot_of.get(span.request_id)
            if row is None:
                row = self._assign(span.request_id)
            end = span.first + len(span.pages)
            if end > self.width:
                raise ValueError(
                    f"request {span.request_id!r}: {end} pages of {span.life_cycle!r} exceed the "
                    f"table width {self.width} (max_position / page_size)"
                )
            self.host[span.life_cycle][row, span.first : end] = span.pages
            dirty[span.life_cycle].append((row, span.first, end))
            self._used[row] = max(int(self._used[row]), end)
        return self._push(dirty)

    # -- internals -------------------------------------------------------------------------------

    def _push(self, dirty: dict[str, list[tuple[int, int, int]]]) -> int:
        """Copy the dirty cells' final host values to the device tables (values are read from
        the mirror after every change, so a cell named twice carries one value)."""
        indices = {
            group: np.concatenate(
                [np.arange(r * self.width + a, r * self.width + b) for r, a, b in spans]
            )
            for group, spans in dirty.items()
            if spans
        }
        total = sum(len(index) for index in indices.values())
        if not total:
            return 0
        self._staging.reverse()
        staging = self._staging[0]
        buffer = staging.hold(2 * total)
        host = buffer.numpy()
        at = 0
        for group, index in indices.items():
            host[at : at + len(index)] = index
            host[total + at : total + at + len(index)] = self.host[group].reshape(-1)[index]
            at += len(index)
        cells = buffer.to(self.device, non_blocking=True)
        at = 0
        for group, index in indices.items():
            where = cells[at : at + len(index)]
            values = cells[total + at : total + at + len(index)].to(torch.int32)
            self.device_tables[group].view(-1).index_copy_(0, where, values)
            at += len(index)
        staging.copied()
        return total

    def _assign(self, request_id: str) -> int:
        if not self._free:
            self._grow(2 * self.slots)
        row = self._free.pop()
        self._slot_of[request_id] = row
        return row

    def _grow(self, slots: int) -> None:
        """Room for `slots` rows (the old rows keep their contents); new rows are free."""
        old = len(self._used)
        rows = slots + 1
        for group in self.groups:
            host = np.full((rows, self.width), self.null_page, dtype=np.int32)
            shape = (rows, self.width)
            table = torch.full(shape, self.null_page, dtype=torch.int32, device=self.device)
            if group in self.host:
                host[:old] = self.host[group]
                table[:old].copy_(self.device_tables[group])
            self.host[group], self.device_tables[group] = host, table
        self._used = np.concatenate([self._used, np.zeros(rows - old, dtype=np.int64)])
        # Lowest rows first: a small batch's rows stay together.
        self._free.extend(range(rows - 1, old - 1, -1))
