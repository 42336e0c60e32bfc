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
| prefill chunk     | prefill span in a step     | prefill_chunk_ms                            |
| host / disk copy  | page (block_size tokens)   | page bytes / host_link / disk_read          |
| hand-off (disagg) | byte moved to a generation rank | 1 / handoff_link (off the step loop)   |

KV bytes per token = 2 (K and V) * layers * kv_heads * head_dim * the KV cache's own dtype
(`kv_dtype_bytes`: 1 for an fp8 cache): host and disk copies move pages in it, and the GPU's
decode step reads an fp8 cache's pages as they are (docs/engine-gpu.md, "FP8 KV cache").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .cost_figures import Hardware, ModelShape


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
        return cls(
            linear_s_per_token=2 * params / (hardware.matmul_tflops * 1e12),
            attention_s_per_pair=attention_flops / (hardware.attention_tflops * 1e12),
            weights_read_s=params * model.dtype_bytes / (hardware.weights_read_tb_s * 1e12),
            decode_kv_s_per_token=kv_bytes_per_token / (hardware.decode_kv_read_tb_s * 1e12),
            host_copy_s_per_page=page_bytes / (hardware.host_link_gb_s * 1e9),
            disk_copy_s_per_page=page_bytes / (hardware.disk_read_gb_s * 1e9),
            step_overhead_s=hardware.step_overhead_ms / 1e3,
            handoff_s_per_byte=1 / (hardware.handoff_link_gb_s * 1e9),
            prefill_chunk_s=hardware.prefill_chunk_ms / 1e3,
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
            + sum(work.decode_contexts) * self.decode_kv_s_per_token
            + work.host_pages_in * self.host_copy_s_per_page
            + work.disk_pages_in * self.disk_copy_s_per_page
        )

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
