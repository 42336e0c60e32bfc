"""Decode steps through static buffers, padded to a batch-size bucket and replayed as CUDA graphs.

A decode step (one new token per sequence) has the same shapes every time once the batch is
padded to a bucket, so the whole forward and the greedy argmax are captured once per bucket
and replayed: one launch instead of ~45 per layer plus the attention wrapper's Python.

| buffer          | shape           | padded rows (b >= batch)                             |
| --------------- | --------------- | ---------------------------------------------------- |
| meta[TOKENS]    | [max_b] int64   | token 0                                              |
| meta[POSITIONS] | [max_b] int64   | position 0                                           |
| meta[VALID]     | [max_b] int64   | 0: their K/V are written as zeros into the null page |
| meta[SLOT0 + g] | [max_b] int64   | slot 0 of the null page                              |
| seqused_k       | [max_b] int32   | 1 (the null page's first row)                        |
| page_table[g]   | [max_b, W] int32| the null page in column 0                            |
| meta[READ]      | [max_b] int64   | the null page (hybrid models: the SSM state read)    |
| meta[WRITE]     | [max_b] int64   | the null page (the SSM state written: zeros, VALID 0)|
| meta[TABLE_ROW] | [max_b] int64   | row 0 of the persistent tables (all null pages)      |

Page tables: in the engine the runner follows the kvstore manager's page-table changes
(`follow`): every admitted request's tables live on the device (kv/page_tables.py), the host
writes only what changed since the step before, and a step gathers its rows (meta[TABLE_ROW])
into page_table[g] on the device, outside the graph. Without a manager to follow (unit tests)
each step lays its chunks' page ids into the tables from the host.

The host fills pinned copies with numpy and copies them in asynchronously; the step's one
device-to-host copy (the sampled tokens) happens after the replay, so the pinned buffers are
free again when the next step fills them. Where no graph runs (CPU, a backend that cannot be
captured, `decode_graphs: static`) the very same buffer code runs eagerly: what CI tests is
what the GPU replays. A hybrid model's SSM layers step every row at once from its state pages
(`model/ssm_step.py`): READ and WRITE, after the slot rows, exist only when the cache has an
`ssm` group.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import numpy as np
import torch

from ..attention.batch import AttentionMetadata, ForwardBatch, StateRows
from ..config.model_config import STATE_GROUP
from ..kv.kv_cache import PagedKVCache
from ..kv.page_tables import NULL_ROW, PersistentPageTables
from ..model.fused import fusable

log = logging.getLogger(__name__)

MODES = ("auto", "static", "off")
BUCKET_STEPS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
TOKENS, POSITIONS, VALID, SLOT0 = 0, 1, 2, 3
GRAPH_SAFE_BACKENDS = ("flash",)  # read only tensors and host ints fixed at capture


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Padded batch sizes up to `max_batch` (which is always the last one)."""
    return (*(b for b in BUCKET_STEPS if b < max_batch), max_batch)


def is_decode_step(chunks: Sequence) -> bool:
    """True when every chunk computes exactly one token (the shape graphs are captured for)."""
    return bool(chunks) and all(len(c.new_tokens) == 1 for c in chunks)


class _PaddedWrites:
    """The cache as a padded step's forward sees it: pad rows' K/V are zeroed before the write,
    so the null page they land in stays all zeros (the kvstore's integrity check)."""

    def __init__(self, cache: PagedKVCache, valid: torch.Tensor) -> None:
        self._cache, self._valid = cache, valid[:, None, None]

    def group_of(self, layer: int) -> str:
        return self._cache.group_of(layer)

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._cache.kv(layer)

    def kv_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self._cache.kv_scales(layer)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        # K and V leave the pad kernel stacked, so that one copy stores both.
        self._cache.write_stacked(layer, zero_pad_rows(k, v, self._valid), slots)

    def write_rotating(self, layer: int, qkv, rope, slots, heads: int) -> torch.Tensor | None:
        # Pad rows store nothing: the null page they point at stays zeros.
        return self._cache.write_rotating(layer, qkv, rope, slots, heads, self._valid.view(-1))

    # A hybrid model's state pages (StateRows.keep makes the pad rows store zeros).
    def states(self, layer: int) -> torch.Tensor:
        return self._cache.states(layer)

    @property
    def page_size(self) -> int:
        return self._cache.page_size

    @property
    def null_page_id(self) -> int:
        return self._cache.null_page_id


@fusable
def zero_pad_rows(k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """k and v stacked `[2, T, kv_heads, head_dim]`, the rows where `valid [T, 1, 1]` is
    false set to zero."""
    zero = k.new_zeros(())
    return torch.stack((torch.where(valid, k, zero), torch.where(valid, v, zero)))


class _HostBuffers:
    """One set of pinned staging buffers and the event after which the device has read them."""

    def __init__(self, rows: int, max_b: int, widths: dict[str, int], device) -> None:
        pin = device.type == "cuda"
        self.meta = torch.zeros(rows, max_b, dtype=torch.int64, pin_memory=pin)
        self.seqused = torch.ones(max_b, dtype=torch.int32, pin_memory=pin)
        self.tables = {
            g: torch.zeros(max_b * w, dtype=torch.int32, pin_memory=pin) for g, w in widths.items()
        }
        self._event = torch.cuda.Event() if pin else None
        self._pending = False

    def copied(self) -> None:
        if self._event is not None:
            self._event.record()
            self._pending = True

    def wait(self) -> None:
        """Block until the last copies out of these buffers have run (normally long done)."""
        if self._pending:
            self._event.synchronize()
            self._pending = False


class DecodeRunner:
    """Runs decode steps of up to `max_batch` sequences over static buffers of one cache."""

    def __init__(self, model, cache: PagedKVCache, backend, max_batch: int, capture: bool) -> None:
        self.model, self.cache, self.backend = model, cache, backend
        self.buckets = batch_buckets(max_batch)
        self.capture = capture and cache.device.type == "cuda"
        self.capture = self.capture and backend.name in GRAPH_SAFE_BACKENDS
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._pool = None
        device, max_b, page = cache.device, self.buckets[-1], cache.page_size
        self.groups = tuple(cache.num_pages)
        # A page table spans the whole context (a window group's old pages are null ones).
        self.widths = dict.fromkeys(self.groups, -(-cache.config.max_position // page))
        # READ / WRITE rows (a hybrid model's state pages) follow the slot rows.
        self._state_row = SLOT0 + len(self.groups) if STATE_GROUP in self.groups else None
        rows = SLOT0 + len(self.groups) + (2 if self._state_row is not None else 0) + 2
        self._table_row = rows - 2  # per row, its row of the persistent tables
        self._feed_row = rows - 1  # per row, the row of the step before whose token it takes
        self.tables: PersistentPageTables | None = None  # set by `follow`
        # Two sets of pinned buffers: with a step in flight, the host fills the next step's
        # set while the device may still be copying the other one in.
        self._host = [_HostBuffers(rows, max_b, self.widths, device) for _ in range(2)]
        self.meta = torch.zeros(rows, max_b, dtype=torch.int64, device=device)
        self.seqused_k = torch.ones(max_b, dtype=torch.int32, device=device)
        null = cache.null_page_id
        self.page_tables = {
            g: torch.full((max_b, w), null, dtype=torch.int32, device=device)
            for g, w in self.widths.items()
        }
        self._table_scratch = {
            g: torch.empty(max_b * w, dtype=torch.int32, device=device)
            for g, w in self.widths.items()
        }
        self._cu = torch.arange(max_b + 1, dtype=torch.int32, device=device)
        self._rows = torch.arange(max_b, dtype=torch.int64, device=device)

    def follow(self, read_changes) -> PersistentPageTables:
        """Keep every admitted request's page tables on the device from now on, updated from
        `read_changes()` (the kvstore manager's `watch_page_tables()`); steps then gather
        their rows there instead of laying in whole tables from the chunks."""
        cache, width = self.cache, next(iter(self.widths.values()))
        device = cache.device
        self.tables = PersistentPageTables(
            self.groups, width, self.buckets[-1], cache.null_page_id, device, read_changes
        )
        return self.tables

    def fits(self, chunks: Sequence) -> bool:
        """Whether `chunks` is a decode step this runner can take."""
        return is_decode_step(chunks) and len(chunks) <= self.buckets[-1]

    def bucket(self, batch: int) -> int:
        """The smallest bucket that holds `batch` sequences."""
        return next(b for b in self.buckets if b >= batch)

    def run(self, chunks: Sequence, feed=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits `[batch, vocab]` (fp32) and greedy tokens `[batch]` of a decode step.
        `feed` (device tokens, row per chunk or -1): input tokens still on the device."""
        batch = len(chunks)
        padded = self.bucket(batch)
        width = self._load(chunks, padded, None if feed is None else feed[1])
        if feed is not None:
            self._feed(feed[0], batch)
        if self.capture:
            graph = self.graphs.get(padded) or self._capture(padded)
            if graph is not None:
                graph[0].replay()
                return graph[1][:batch], graph[2][:batch]
        logits, tokens = self._forward(padded, width, [c.start + 1 for c in chunks])
        return logits[:batch], tokens[:batch]

    def capture_all(self) -> int:
        """Capture every bucket now (largest first, so that smaller ones reuse its memory);
        returns how many graphs exist. The buffers hold pad rows only meanwhile, so the
        warm-up runs write nothing but zeros into the null page."""
        if not self.capture:
            return 0
        self._load([], self.buckets[-1])
        for padded in reversed(self.buckets):
            if padded not in self.graphs and self._capture(padded) is None:
                break
        return len(self.graphs)

    # -- host side -------------------------------------------------------------------------------

    def _load(self, chunks: Sequence, padded: int, feed_rows=None) -> dict[str, int]:
        """Fill the pinned buffers for `chunks` padded to `padded` rows and copy them in;
        returns each group's page-table width this step uses."""
        batch, page, null = len(chunks), self.cache.page_size, self.cache.null_page_id
        self._host.reverse()
        host = self._host[0]
        host.wait()
        meta = host.meta.numpy()
        meta[self._feed_row, :padded] = -1
        if feed_rows is not None:
            meta[self._feed_row, :batch] = feed_rows
        starts = np.fromiter((c.start for c in chunks), np.int64, batch)
        width = int(starts.max()) // page + 1 if batch else 1  # pages read
        meta[TOKENS, :batch] = np.fromiter((c.new_tokens[0] for c in chunks), np.int64, batch)
        meta[POSITIONS, :batch] = starts
        meta[VALID, :batch] = 1
        meta[[TOKENS, POSITIONS, VALID], batch:padded] = 0
        seqused = host.seqused.numpy()
        seqused[:batch] = starts + 1
        seqused[batch:padded] = 1
        widths = dict.fromkeys(self.groups, width)
        if self.tables is not None and batch:
            # The tables are on the device already: only the changes go, then a gather.
            self.tables.update()
            table_rows = self.tables.rows_of([chunk.sequence.key for chunk in chunks])
            meta[self._table_row, :batch] = table_rows
            meta[self._table_row, batch:padded] = NULL_ROW
            tables = {group: (self.tables.host[group], table_rows) for group in self.groups}
        else:
            tables = self._lay_tables(host, chunks, padded, width)
        for index, group in enumerate(self.groups):
            table, table_rows = tables[group]
            meta[SLOT0 + index, :batch] = table[table_rows, starts // page] * page + (starts % page)
            meta[SLOT0 + index, batch:padded] = null * page
            if group == STATE_GROUP:
                self._load_state_rows(meta, table, table_rows, starts, padded)
        self.meta.copy_(host.meta, non_blocking=True)
        self.seqused_k.copy_(host.seqused, non_blocking=True)
        rows = self.meta[self._table_row, :padded]
        for group in self.groups:
            # Only the columns this step reads; later ones keep older pages, never read
            # (seqused_k ends every row before them).
            scratch = self._table_scratch[group][: padded * width]
            if self.tables is not None and batch:
                source = self.tables.device_tables[group][:, :width]
                torch.index_select(source, 0, rows, out=scratch.view(padded, width))
            else:
                scratch.copy_(host.tables[group][: padded * width], non_blocking=True)
            self.page_tables[group][:padded, :width].copy_(scratch.view(padded, width))
        host.copied()
        return widths

    def _lay_tables(self, host: _HostBuffers, chunks: Sequence, padded: int, width: int):
        """Without persistent tables: every chunk's pages laid into the pinned tables (one
        flat array per group, laid in by a mask: row-major, so the mask's True cells take the
        rows' pages in order); per group the host table and each chunk's row in it."""
        batch, null = len(chunks), self.cache.null_page_id
        columns, tables = np.arange(width), {}
        for group in self.groups:
            table = host.tables[group].numpy()[: padded * width].reshape(padded, width)
            table[:] = null
            pages = [chunk.page_ids[group][:width] for chunk in chunks]
            lengths = np.fromiter(map(len, pages), np.int64, batch)
            flat = np.fromiter(itertools.chain.from_iterable(pages), np.int32, int(lengths.sum()))
            table[:batch][columns < lengths[:, None]] = flat
            tables[group] = (table, np.arange(batch))
        return tables

    def _load_state_rows(self, meta, table, rows, starts, padded: int) -> None:
        """READ: the page of block (start-1)//B (the null page's zeros at start 0); WRITE: the
        page of the block the new token is in (`rows`: each chunk's row of `table`)."""
        read, write, null = self._state_row, self._state_row + 1, self.cache.null_page_id
        page = self.cache.page_size
        before = np.maximum(starts - 1, 0) // page
        meta[read, : len(starts)] = np.where(starts > 0, table[rows, before], null)
        meta[write, : len(starts)] = table[rows, starts // page]
        meta[[read, write], len(starts) : padded] = null

    def _feed(self, previous: torch.Tensor, batch: int) -> None:
        """Input tokens of rows whose token the step before sampled, gathered on the device
        (a pageable host copy here would wait for the step in flight)."""
        source = self.meta[self._feed_row, :batch]
        tokens = self.meta[TOKENS, :batch]
        gathered = previous[source.clamp(min=0)]
        tokens.copy_(torch.where(source >= 0, gathered, tokens))

    # -- device side -----------------------------------------------------------------------------

    def _forward(
        self, padded: int, widths: dict[str, int] | None, context_lens: list[int] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The padded forward over the static buffers. `widths` None: the whole page table
        (graph capture); else only the columns this step uses (eager)."""
        page = self.cache.page_size
        lens = tuple(context_lens or ()) + (1,) * (padded - len(context_lens or ()))
        attention, slots = {}, {}
        for index, group in enumerate(self.groups):
            table = self.page_tables[group][:padded]
            if widths is not None:
                table = table[:, : widths[group]].contiguous()
            attention[group] = AttentionMetadata(
                cu_seqlens_q=self._cu[: padded + 1],
                seqused_k=self.seqused_k[:padded],
                page_table=table,
                max_seqlen_q=1,
                max_seqlen_k=table.shape[1] * page,
                query_lens=(1,) * padded,
                context_lens=lens,
                page_size=page,
            )
            slots[group] = self.meta[SLOT0 + index, :padded]
        valid = self.meta[VALID, :padded] != 0
        state_rows = None
        if self._state_row is not None:
            read, write = self.meta[self._state_row : self._state_row + 2, :padded]
            state_rows = StateRows(read, write, valid)
        batch = ForwardBatch(
            token_ids=self.meta[TOKENS, :padded],
            positions=self.meta[POSITIONS, :padded],
            attention=attention,
            slots=slots,
            last_token_index=self._rows[:padded],
            state_rows=state_rows,
        )
        cache = _PaddedWrites(self.cache, valid)
        logits = self.model(batch, cache, self.backend)
        return logits, logits.argmax(dim=-1)

    def _capture(self, padded: int):
        """Capture bucket `padded` (after one eager warm-up run); None, and no more capture, on
        failure, so the step runs eagerly."""
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._forward(padded, None, None)  # kernel JIT and handles, outside the graph
            torch.cuda.current_stream().wait_stream(stream)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits, tokens = self._forward(padded, None, None)
        except Exception:  # any backend op that cannot be captured: stay eager
            log.exception("CUDA graph capture of decode batch %d failed; running eagerly", padded)
            self.capture = False
            return None
        self.graphs[padded] = (graph, logits, tokens)
        return self.graphs[padded]
