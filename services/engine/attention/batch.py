"""One forward step's inputs: the flattened new tokens of several sequences and their pages.

Layout of a batch of B sequences, T new tokens in all (sequence b has `num_cached[b]` tokens
already in its pages and `n[b]` new ones):

| tensor          | shape    | meaning                                                    |
| --------------- | -------- | ---------------------------------------------------------- |
| token_ids       | [T]      | new tokens, sequence after sequence                        |
| positions       | [T]      | num_cached[b] + i for the i-th new token of sequence b     |
| cu_seqlens_q    | [B + 1]  | start of each sequence's new tokens in token_ids (int32)   |
| seqused_k       | [B]      | num_cached[b] + n[b]: keys each sequence attends to (int32)|
| page_table[g]   | [B, P]   | page ids of group g in token order, padded with null (int32)|
| slots[g]        | [T]      | page * page_size + offset where each new token's K/V goes  |
| state_rows      | 3 x [B]  | decode graphs only: each row's SSM state pages (StateRows) |

Recurrent (SSM) layers read their state pages from `chunks` in an eager step, and from
`state_rows` in a decode-graph step, which has no chunks (model/paged_ssm.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..config.model_config import STATE_GROUP, WINDOW_GROUP
from ..kv.kv_cache import PagedKVCache


@dataclass(frozen=True)
class SequenceChunk:
    """One sequence's share of a step: its new tokens, its cached length and its pages.

    `page_ids` maps each layer group to that group's page ids in token order; they must cover
    `num_cached + len(new_tokens)` positions. In a window group, pages wholly before the window
    may be the cache's null page.
    """

    new_tokens: Sequence[int]
    num_cached: int
    page_ids: Mapping[str, Sequence[int]]

    @property
    def context_len(self) -> int:
        return self.num_cached + len(self.new_tokens)


@dataclass(frozen=True)
class AttentionMetadata:
    """What an attention backend reads for one layer group (see the module table)."""

    cu_seqlens_q: torch.Tensor
    seqused_k: torch.Tensor
    page_table: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    page_size: int


@dataclass(frozen=True)
class StateRows:
    """Each decoding row's SSM state pages, `[B]` int64 on the device: `read` holds the state
    before its token (the null page's zeros before a sequence's first), `write` takes the state
    after it; `keep` (bool, None: every row) is False on a graph's pad rows, which store zeros
    (model/ssm_step.py)."""

    read: torch.Tensor
    write: torch.Tensor
    keep: torch.Tensor | None = None

    @classmethod
    def of(cls, chunks: Sequence, page_size: int, null_page: int, device) -> StateRows:
        """The pages of one-token chunks (`num_cached`, `page_ids` as `SequenceChunk`'s)."""
        read, write = [], []
        for chunk in chunks:
            start, pages = chunk.num_cached, chunk.page_ids[STATE_GROUP]
            read.append(pages[(start - 1) // page_size] if start else null_page)
            write.append(pages[start // page_size])
        both = torch.tensor([read, write], dtype=torch.int64).to(device, non_blocking=True)
        return cls(both[0], both[1])


@dataclass(frozen=True)
class ForwardBatch:
    """Flattened inputs of one forward step; build with `ForwardBatch.build`."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    attention: Mapping[str, AttentionMetadata]
    slots: Mapping[str, torch.Tensor]
    last_token_index: torch.Tensor
    # The chunks it was built from: recurrent layers read their own pages per sequence.
    chunks: tuple[SequenceChunk, ...] = ()
    # A decode-graph step: every row's SSM state pages as device tensors (model/ssm_step.py).
    state_rows: StateRows | None = None

    @property
    def num_sequences(self) -> int:
        return int(self.last_token_index.numel())

    @classmethod
    def build(cls, chunks: Sequence[SequenceChunk], cache: PagedKVCache) -> ForwardBatch:
        """Validate `chunks` against `cache` and lay them out as tensors on the cache's device."""
        if not chunks:
            raise ValueError("a forward batch needs at least one sequence")
        for b, chunk in enumerate(chunks):
            _check_chunk(b, chunk, cache)
        device, page_size = cache.device, cache.page_size
        query_lens = tuple(len(c.new_tokens) for c in chunks)
        context_lens = tuple(c.context_len for c in chunks)
        cu = [0]
        for n in query_lens:
            cu.append(cu[-1] + n)
        tokens = [t for c in chunks for t in c.new_tokens]
        positions = [c.num_cached + i for c in chunks for i in range(len(c.new_tokens))]
        cu_seqlens_q = torch.tensor(cu, dtype=torch.int32, device=device)
        seqused_k = torch.tensor(context_lens, dtype=torch.int32, device=device)
        attention, slots = {}, {}
        for group in cache.num_pages:
            width = max(len(c.page_ids[group]) for c in chunks)
            table = [
                [*c.page_ids[group], *[cache.null_page_id] * (width - len(c.page_ids[group]))]
                for c in chunks
            ]
            slots[group] = torch.tensor(
                [
                    c.page_ids[group][p // page_size] * page_size + p % page_size
                    for c in chunks
                    for p in range(c.num_cached, c.context_len)
                ],
                dtype=torch.int64,
                device=device,
            )
            attention[group] = AttentionMetadata(
                cu_seqlens_q=cu_seqlens_q,
                seqused_k=seqused_k,
                page_table=torch.tensor(table, dtype=torch.int32, device=device),
                max_seqlen_q=max(query_lens),
                max_seqlen_k=max(context_lens),
                query_lens=query_lens,
                context_lens=context_lens,
                page_size=page_size,
            )
        return cls(
            token_ids=torch.tensor(tokens, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            attention=attention,
            slots=slots,
            last_token_index=(cu_seqlens_q[1:] - 1).to(torch.int64),
            chunks=tuple(chunks),
        )


def _check_chunk(b: int, chunk: SequenceChunk, cache: PagedKVCache) -> None:
    """Raise ValueError, with the numbers, for a chunk the cache cannot serve."""
    if not chunk.new_tokens:
        raise ValueError(f"sequence {b} has no new tokens")
    if chunk.num_cached < 0:
        raise ValueError(f"sequence {b} has num_cached={chunk.num_cached} < 0")
    limit = cache.config.max_position
    if chunk.context_len > limit:
        raise ValueError(f"sequence {b} reaches {chunk.context_len} tokens > max_position {limit}")
    vocab = cache.config.vocab_size
    bad_tokens = [t for t in chunk.new_tokens if not 0 <= t < vocab]
    if bad_tokens:
        raise ValueError(f"sequence {b} has token ids {bad_tokens[:5]} outside 0..{vocab - 1}")
    needed = -(-chunk.context_len // cache.page_size)
    for group, num_pages in cache.num_pages.items():
        pages = chunk.page_ids.get(group)
        if pages is None:
            raise ValueError(f"sequence {b} has no page ids for layer group {group!r}")
        if len(pages) < needed:
            raise ValueError(
                f"sequence {b} group {group!r}: {len(pages)} pages cover fewer than "
                f"{chunk.context_len} tokens at page_size {cache.page_size}"
            )
        out_of_range = [p for p in pages if not 0 <= p < num_pages]
        if out_of_range:
            raise ValueError(
                f"sequence {b} group {group!r}: page ids {out_of_range[:5]} "
                f"outside 0..{num_pages - 1}"
            )
        first_read = _first_read_position(chunk.num_cached, group, cache) // cache.page_size
        used = pages[first_read:needed]
        if group == STATE_GROUP:  # holes between: only stored states have pages
            used = [pages[needed - 1]] + ([pages[first_read]] if chunk.num_cached else [])
        if cache.null_page_id in used:
            raise ValueError(
                f"sequence {b} group {group!r}: pages {first_read}..{needed - 1} are read or "
                f"written but include the null page {cache.null_page_id}"
            )


def _first_read_position(num_cached: int, group: str, cache: PagedKVCache) -> int:
    """First key position the chunk's first new token attends to in `group`."""
    if group == WINDOW_GROUP:
        return max(0, num_cached - cache.config.window_size + 1)
    if group == STATE_GROUP:  # the page holding the state after the last cached token
        return max(0, num_cached - 1)
    return 0
