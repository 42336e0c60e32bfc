"""The engine's compute, replaced by a roofline cost model of one engine step.

One step computes prefill chunks and one token of each decoding request together:

    step = overhead
         + max(weights read once, linear FLOPs of every computed token)     # shared matmuls
         + attention FLOPs of the prefill chunks (each token over its context so far)
         + a fixed cost per prefill chunk (its eager launches; decode steps run as graphs)
         + KV bytes every decoding request reads (its whole context)
         + host/disk pages onboarded for newly admitted requests

| term              | per                        | figure                                      |
|-------------------|----------------------------|---------------------------------------------|
| linear            | computed token             | 2 * params / matmul_tflops                  |
| attention         | (query, context) pair      | 4 * layers * query_heads * head_dim / attn  |
| weights read      | step with any token        | params * dtype_bytes / weights_read_tb_s    |
| decode KV read    | context token of a decode  | kv bytes per token / decode_kv_read_tb_s    |
| decode program    | longest decode's token     | its KV head's bytes / parts / program rate  |
| prefill chunk     | prefill span in a step     | prefill_chunk_ms                            |
| host / disk copy  | page (block_size tokens)   | page bytes / host_link / disk_read          |
| hand-off (disagg) | byte moved to a generation rank | 1 / handoff_link (off the step loop)   |

KV bytes per token = 2 (K and V) * layers * kv_heads * head_dim * the KV cache's own dtype
(`kv_dtype_bytes`: 1 for an fp8 cache): host and disk copies move pages in it, and the GPU's
decode step reads an fp8 cache's pages as they are (docs/engine-gpu.md, "FP8 KV cache").

A decode step's KV read takes the longer of two times: all its KV bytes at the chip's rate, or
its longest sequence's bytes of one KV head at one program's rate (`decode_program_gb_s`, when
given). The engine's Triton decode kernel splits each sequence's keys into parts until the
programs fill the chip twice over (at most 16 parts,
services/engine/attention/attn_decode_kernel.py), and the cost model splits the same way.
With `hardware.decode_split: false` a bf16 cache decodes as flash-attn's paged kernel did, one
program per (sequence, KV head): a step of 2 sequences x 8 KV heads keeps 16 of the chip's
multiprocessors busy and reads at a fraction of its bandwidth (the fleet replays recorded
before the split kernel decoded bf16 caches; an fp8 cache always split).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .cost_figures import Hardware, ModelShape

MAX_DECODE_SPLITS = 16  # the split decode kernel's most parts per sequence


@dataclass(frozen=True)
class StepWork:
    """What one engine step computes: prefill spans [start, end) and decode contexts."""

    prefill_spans: tuple[tuple[int, int], ...] = ()
    decode_contexts: tuple[int, ...] = ()
    host_pages_in: int = 0
    disk_pages_in: int = 0

    @property
    def computed_tokens(self) -> int:
        """Tokens whose linear layers run this step."""
        return sum(end - start for start, end in self.prefill_spans) + len(self.decode_contexts)


@dataclass(frozen=True)
class CostModel:
    """Seconds per unit of work, derived once from the model shape and hardware figures."""

    linear_s_per_token: float
    attention_s_per_pair: float
    weights_read_s: float
    decode_kv_s_per_token: float
    host_copy_s_per_page: float
    disk_copy_s_per_page: float
    step_overhead_s: float
    handoff_s_per_byte: float = 0.0
    prefill_chunk_s: float = 0.0
    decode_program_s_per_token: float = 0.0  # one program's seconds per context token; 0: off
    decode_kv_heads: int = 1
    decode_split_programs: int = 0  # programs a split decode kernel aims at; 0: unsplit

    @classmethod
    def from_figures(
        cls,
        model: ModelShape,
        hardware: Hardware,
        block_size: int,
        kv_dtype_bytes: int | None = None,
    ) -> CostModel:
        """Derive the per-unit costs (table in the module docstring)."""
        params = model.params_billion * 1e9
        kv_elements_per_token = 2 * model.layers * model.kv_heads * model.head_dim
        kv_bytes_per_token = kv_elements_per_token * (kv_dtype_bytes or model.dtype_bytes)
        page_bytes = kv_bytes_per_token * block_size
        attention_flops = 4 * model.layers * model.query_heads * model.head_dim
        program_rate = hardware.decode_program_gb_s * 1e9
        split = hardware.decode_split or kv_dtype_bytes == 1  # an fp8 cache always split
        # a disk page read on the core thread (priced at its admission) reaches the device
        # from its staging row over the host link
        disk_link_gb_s = (
            hardware.host_link_gb_s if hardware.admit_ms_per_disk_page else hardware.disk_read_gb_s
        )
        return cls(
            linear_s_per_token=2 * params / (hardware.matmul_tflops * 1e12),
            attention_s_per_pair=attention_flops / (hardware.attention_tflops * 1e12),
            weights_read_s=params * model.dtype_bytes / (hardware.weights_read_tb_s * 1e12),
            decode_kv_s_per_token=kv_bytes_per_token / (hardware.decode_kv_read_tb_s * 1e12),
            host_copy_s_per_page=page_bytes / (hardware.host_link_gb_s * 1e9),
            disk_copy_s_per_page=page_bytes / (disk_link_gb_s * 1e9),
            step_overhead_s=hardware.step_overhead_ms / 1e3,
            handoff_s_per_byte=1 / (hardware.handoff_link_gb_s * 1e9),
            prefill_chunk_s=hardware.prefill_chunk_ms / 1e3,
            decode_program_s_per_token=(
                kv_bytes_per_token / model.kv_heads / program_rate if program_rate else 0.0
            ),
            decode_kv_heads=model.kv_heads,
            decode_split_programs=2 * hardware.multiprocessors if split else 0,
        )

    def attention_pairs(self, start: int, end: int) -> int:
        """(query, key) pairs of causal attention for tokens [start, end): sum of (p + 1)."""
        return (end * (end + 1) - start * (start + 1)) // 2

    def step_seconds(self, work: StepWork) -> float:
        """Duration of one engine step doing `work` (0 for an empty step)."""
        tokens = work.computed_tokens
        if tokens == 0 and not (work.host_pages_in or work.disk_pages_in):
            return 0.0
        linear = max(self.weights_read_s, tokens * self.linear_s_per_token) if tokens else 0.0
        pairs = sum(self.attention_pairs(start, end) for start, end in work.prefill_spans)
        return (
            self.step_overhead_s
            + linear
            + pairs * self.attention_s_per_pair
            + len(work.prefill_spans) * self.prefill_chunk_s
            + self.decode_kv_seconds(work.decode_contexts)
            + work.host_pages_in * self.host_copy_s_per_page
            + work.disk_pages_in * self.disk_copy_s_per_page
        )

    def host_seconds(self, step_s: float) -> float:
        """The host part of a step of `step_s` seconds (its overhead: planning, launches); the
        rest is the accelerator's."""
        return min(self.step_overhead_s, step_s)

    def decode_kv_seconds(self, contexts: tuple[int, ...]) -> float:
        """The KV read of a step's decodes: every byte at the chip's rate, or the longest
        sequence's program at one program's rate, whichever takes longer."""
        if not contexts:
            return 0.0
        chip = sum(contexts) * self.decode_kv_s_per_token
        if not self.decode_program_s_per_token:
            return chip
        parts = 1
        if self.decode_split_programs:
            wanted = -(-self.decode_split_programs // (len(contexts) * self.decode_kv_heads))
            parts = max(1, min(wanted, MAX_DECODE_SPLITS))
        return max(chip, max(contexts) * self.decode_program_s_per_token / parts)

    def prefill_seconds(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """One request's prefill alone, in chunks of everything at once (for docs and tests)."""
        return self.step_seconds(StepWork(prefill_spans=((cached_tokens, prompt_tokens),)))

    def handoff_seconds(self, moved_bytes: int, host_pages: int = 0, disk_pages: int = 0) -> float:
        """A hand-off's transfer: the moved bytes over the link, plus the receiver's onboarding
        of the pages it held on its host / disk tier."""
        return (
            moved_bytes * self.handoff_s_per_byte
            + host_pages * self.host_copy_s_per_page
            + disk_pages * self.disk_copy_s_per_page
        )

    def decode_seconds(self, contexts: Iterable[int]) -> float:
        """One decode step over requests with these contexts."""
        return self.step_seconds(StepWork(decode_contexts=tuple(contexts)))
