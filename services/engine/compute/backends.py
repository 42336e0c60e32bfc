"""Compute backends: what runs a step's chunks and picks their next tokens, from a registry.

`torch` runs the model over the paged KV tensors. The `sim` backend (cost-model timing, no
tensors, compute_sim.py) has the same interface: it gets the same chunks and page ids from
the scheduler and returns tokens, so the scheduler and the kvstore calls are identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ....kvstore.tiers.stack import KVTiers
from ..attention.backends import make_backend
from ..attention.batch import ForwardBatch, SequenceChunk
from ..config.engine_config import EngineConfig
from ..kv import rope_store
from ..kv.device_kv_cache import DeviceKVCache
from ..kv.kv_budget import kv_budget, probe_device_memory
from ..kv.kv_calibration import calibrate_kv_scales
from ..kv.kv_quant import KVScales, is_fp8
from ..kv.kv_setup import build_kv, kv_cache_dtype, open_kv_tiers, tier_config
from ..model import decode_matmul, fused
from ..model.weights import build_model, load_checkpoint
from ..request.scheduled_chunk import ScheduledChunk
from .compute_sim import SimCompute
from .compute_types import ComputeBackend, resolve_model_config
from .cuda_graphs import DecodeRunner
from .device import resolve_device
from .generation import default_dtype
from .grammar_mask import LogitMasks
from .rank_group import join_rank_group, worker_device
from .sampling import NON_FINITE_LOGITS, RowResult, SampleFailure, sample_batch
from .tp import ShardedBytes, TPLayout, broadcast_chunks, load_sharded_checkpoint, shard_config
from .tp.step_plan import OPEN, send_to_workers


class TorchCompute:
    """The model's paged forward, then per-request sampling of the chunks that reach the end."""

    name = "torch"

    def __init__(self, config: EngineConfig) -> None:
        torch.set_num_threads(config.torch_threads)
        self.device = resolve_device(config.device)
        # fused_ops on CUDA: compiled elementwise kernels, and the Triton decode kernels (the
        # matmuls of at most 64 rows with the MLP's activation, RoPE with the K/V write)
        fast = config.fused_ops and self.device.type == "cuda"
        fused.enable(fast)
        decode_matmul.enable(fast)
        rope_store.enable(fast)
        memory = probe_device_memory(self.device)  # before the weights take their share
        self.model_config = resolve_model_config(config)
        chosen = None if config.dtype == "auto" else getattr(torch, config.dtype)
        # Worker 0 of a tensor-parallel rank: its shard here, the others follow (rank_group.py).
        if self.model_config.ssm_layers and config.tensor_parallel > 1:
            raise ValueError(
                f"model {self.model_config.name!r}: tensor_parallel {config.tensor_parallel} "
                "does not split SSM layers yet (serve it at tensor_parallel 1)"
            )
        if config.tensor_parallel > 1:  # before any worker starts: what shard_config refuses
            shard_config(self.model_config, TPLayout(0, config.tensor_parallel))
        self.tp = join_rank_group(config, self.device)
        if self.tp.size > 1:
            self.device = worker_device(self.device, self.tp)
            self.model = load_sharded_checkpoint(config.model_path, self.tp, self.device, chosen)
            self.model_config = shard_config(self.model_config, self.tp)
            dtype = next(self.model.parameters()).dtype
        elif config.model_path:
            self.model = load_checkpoint(config.model_path, self.device, chosen)
            dtype = next(self.model.parameters()).dtype
        else:
            dtype = chosen or default_dtype(self.device)
            self.model = build_model(self.model_config, config.seed, self.device, dtype)
        self.config = config
        budget = kv_budget(self.model_config, config, self.device, memory, dtype)
        kv_dtype = kv_cache_dtype(config, dtype)
        self.kv_scales = self._kv_scales(kv_dtype)
        tag = self.kv_scales.tag() if self.kv_scales is not None else ""
        self.kv = build_kv(self.model_config, config, dtype, budget, tag)
        self.store_config = self.kv.store_config
        self.cache: DeviceKVCache | None = None  # the latest open_tiers' device KV
        self.attention = make_backend(config.attention_backend, self.device)
        self.decode: DecodeRunner | None = None  # static-buffer decode over self.cache
        self._host_tokens: list[torch.Tensor] | None = None  # pinned: sampled tokens
        self._masks = LogitMasks()  # grammar masks of constrained samples

    def open_tiers(self) -> KVTiers:
        """Fresh KV tiers (device KV, host rows, disk index) for a new manager.

        The model reads and writes the new tiers' device KV from now on; the caller closes
        the tiers when its manager is done.
        """
        tiers = open_kv_tiers(self.model_config, self.config, self.kv, self.device)
        if self.tp.size > 1:
            host = tier_config(self.model_config, self.config, self.kv.store_config, self.kv.layout)
            send_to_workers((OPEN, dict(self.kv.store_config.pool_pages), host.host_pages))
            tiers.bytes = ShardedBytes(tiers.bytes)
        self.cache = DeviceKVCache(self.model_config, tiers.device_kv, self.kv_scales)
        self.decode = self._decode_runner(self.cache)
        return tiers

    def follow_page_tables(self, watch) -> None:
        """Keep the decode runner's page tables on the device from the kvstore manager's
        changes (`watch`: its `watch_page_tables`, called only when a runner exists, so
        that nothing is recorded for nobody)."""
        if self.decode is not None:
            self.decode.follow(watch())

    def _kv_scales(self, kv_dtype: torch.dtype) -> KVScales | None:
        """An fp8 cache's scales: calibrated on the model (kv_calibration.py); 1 on a
        tensor-parallel rank, whose workers each hold a shard of the heads."""
        if not is_fp8(kv_dtype):
            return None
        groups = self.model_config.groups
        if self.tp.size > 1:
            return KVScales.ones(groups, self.model_config.num_kv_heads)
        return calibrate_kv_scales(self.model, groups, self.device)

    def _decode_runner(self, cache: DeviceKVCache) -> DecodeRunner | None:
        """Graphs are bound to one cache's tensors: a new cache gets a new runner."""
        mode = self.config.decode_graphs
        if mode == "off" or (mode == "auto" and self.device.type != "cuda") or self.tp.size > 1:
            return None
        return DecodeRunner(
            self.model, cache, self.attention, self.config.max_batch_size, mode == "auto"
        )

    def execute(self, chunks: Sequence[ScheduledChunk]) -> list[RowResult | None]:
        """Forward every chunk in one batch; sample the rows whose chunk reaches the end."""
        return self.launch(chunks)()

    def launch(
        self, chunks: Sequence[ScheduledChunk], feed: tuple[torch.Tensor, list[int]] | None = None
    ) -> Callable[[], list[RowResult | None]]:
        """Queue the step on the device; the returned call waits for its tokens (`execute`'s
        result). Host work that needs no token values can run in between. `feed`: the device
        tokens of the step before and, per chunk, the row whose token is its input (-1: none);
        only a decode-graph step takes it. A greedy decode-graph step's call carries its
        device tokens as `device_tokens`."""
        if self.cache is None:
            raise RuntimeError("TorchCompute has no KV yet: call open_tiers() first")
        greedy = None
        if self.takes_feed(chunks):
            logits, greedy = self.decode.run(chunks, feed)
        elif feed is not None:
            raise ValueError("only a decode-graph step takes its tokens from the device")
        else:
            inputs = [SequenceChunk(c.new_tokens, c.start, c.page_ids) for c in chunks]
            if self.tp.size > 1:
                broadcast_chunks(inputs)
            logits = self.model(ForwardBatch.build(inputs, self.cache), self.cache, self.attention)
        rows, plain = [], True
        for i, c in enumerate(chunks):
            if c.samples:
                rows.append(i)
                plain = plain and c.sequence.sampling.plain_greedy
        # A constrained row is never plain greedy: an all-plain-greedy batch has no mask to apply.
        if rows and plain:
            # The whole batch's argmax on the device, then one copy of B ints to the host; a row
            # whose logits hold NaN or +inf comes back as -1 and fails alone.
            top = greedy if greedy is not None else logits.argmax(dim=-1)
            bad = (torch.isnan(logits) | torch.isposinf(logits)).any(dim=-1)
            picked = self._to_host(torch.where(bad, -1, top))

            def finish() -> list[RowResult | None]:
                return self._place(len(chunks), rows, picked())

            # What a next step planned ahead reads as its input tokens (always valid ids: a
            # failed row's sequence is gone before that step's tokens are read).
            finish.device_tokens = greedy  # None off the graph path: nothing to feed from
            return finish
        tokens: list[RowResult | None] = [None] * len(chunks)
        if rows:
            sequences = [chunks[i].sequence for i in rows]
            # Outside any graph, on its output logits (the graph's own argmax is not used here).
            grammars = [(i, s.grammar) for i, s in zip(rows, sequences, strict=True) if s.grammar]
            self._masks.apply(logits, grammars)
            sampled = sample_batch(
                logits[rows],
                [s.sampling for s in sequences],
                [s.generator for s in sequences],
                [s.prompt for s in sequences],
                [s.output for s in sequences],
            )
            for row, token in zip(rows, sampled, strict=True):
                tokens[row] = token
        return lambda: tokens

    def takes_feed(self, chunks: Sequence[ScheduledChunk]) -> bool:
        """Whether `launch` can take these chunks' input tokens from the device (a decode-graph
        step)."""
        return self.decode is not None and self.decode.fits(chunks)

    def stop_workers(self) -> None:
        """Tell a tensor-parallel rank's other workers to exit (nothing at TP-1)."""
        if self.tp.size > 1:
            broadcast_chunks(None)

    def _to_host(self, values: torch.Tensor) -> Callable[[], list[int]]:
        """Start copying int64 `values` into pinned memory; the call waits and reads them."""
        if values.device.type != "cuda":
            return values.clone().tolist  # the graph's output buffer is reused next step
        # Two buffers: a step in flight copies into one while the host reads the other.
        size = max(values.numel(), self.config.max_batch_size)
        if self._host_tokens is None or self._host_tokens[0].numel() < size:
            self._host_tokens = [
                torch.empty(size, dtype=torch.int64, pin_memory=True) for _ in range(2)
            ]
        self._host_tokens.reverse()
        host = self._host_tokens[0][: values.numel()]
        host.copy_(values, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def read() -> list[int]:
            done.synchronize()
            return host.tolist()

        return read

    @staticmethod
    def _place(count: int, rows: list[int], picked: list[int]) -> list[RowResult | None]:
        tokens: list[RowResult | None] = [None] * count
        for row in rows:
            token = picked[row]
            tokens[row] = token if token >= 0 else SampleFailure(NON_FINITE_LOGITS)
        return tokens


COMPUTE_BACKENDS: dict[str, Callable[[EngineConfig], ComputeBackend]] = {
    "torch": TorchCompute,
    "sim": SimCompute,  # cost-model step time, no tensors (compute_sim.py)
}


def make_compute(config: EngineConfig) -> ComputeBackend:
    """The compute backend named by `config.compute_backend`."""
    try:
        factory = COMPUTE_BACKENDS[config.compute_backend]
    except KeyError:
        known = sorted(COMPUTE_BACKENDS)
        raise ValueError(
            f"compute_backend: unknown {config.compute_backend!r}; known: {known}"
        ) from None
    return factory(config)
