"""What one engine rank runs with: model, slots, step budget, reuse policy, KV pool size.

engine_yaml.py reads the operator's `engine.yaml` into one (`load_engine_config`), through its
typed layout (an unknown key is an error naming it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ...core.kv_cache_dtype import check_kv_cache_dtype

ROLES = ("both", "context", "generation")
DECODE_GRAPH_MODES = ("auto", "static", "off")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine rank needs besides its network addresses."""

    model: str = "tiny"
    model_path: str = ""
    # Weights' dtype: "auto" is the checkpoint's torch_dtype (bf16 on GPU / fp32 on CPU for a
    # preset), else one of DTYPES.
    dtype: str = "auto"
    # The KV cache's pages: auto (the weights' dtype), bf16, or fp8_e4m3 (one byte per value,
    # so twice the pages in the same bytes; kv_quant.py, docs/engine-gpu.md).
    kv_cache_dtype: str = "auto"
    seed: int = 0
    # auto: CUDA when torch sees a GPU, else CPU (warned when a GPU was asked for: device.py)
    device: str = "auto"
    attention_backend: str = "auto"
    compute_backend: str = "torch"
    # The `sim` compute backend (compute_sim.py): hardware figures of this sim_costs.yaml
    # ("": the packaged one), and a factor on every step's sleep (0: no sleeping).
    sim_costs_path: str = ""
    sim_time_scale: float = 1.0
    # A JSON-lines file that gets one line per step: its work and seconds (core/step_log.py);
    # "": none.
    step_log_path: str = ""
    role: str = "both"
    max_batch_size: int = 8
    max_num_batched_tokens: int = 256
    page_size: int = 16
    kv_pages: int | None = None  # per life cycle pool; None: sized by the KV budget (kv_budget.py)
    # The device KV's budget: on CUDA this fraction of the GPU's memory less what is in use, the
    # weights and an activation reserve; on CPU at most cpu_kv_gib. Pools never exceed the peak.
    gpu_memory_fraction: float = 0.9
    cpu_kv_gib: float = 4.0
    # Conversations whose retained turns the pools are sized for (None: one per slot).
    retained_conversations: int | None = None
    # Pages of named pools ((life cycle, pages) pairs, or a mapping in engine.yaml); they
    # override kv_pages / plan_pools for those pools (a simulator arm's exact split).
    kv_pool_pages: tuple[tuple[str, int], ...] = ()
    reuse_policy: str = "per_conversation"
    max_num_turns: int = 5
    keep_root: bool = False  # per_conversation: also keep the first turn's endpoints
    # per_conversation: branch records a conversation keeps; two hold the resume points at the
    # ends of the tools and of the system prompt, where context resets branch (branch hints).
    keep_branch_points: int = 2
    # per_conversation: also plan a branch point where an unhinted turn's cached prefix stops
    # (off: measured to cost more pages than it saves under memory pressure).
    discover_branch_points: bool = False
    checkpoint: bool = True
    checkpoint_margin_tokens: int = 512
    window_replay_tokens: int = 0
    # Hybrid models' recurrent state (the `state` life cycle): a snapshot every this many tokens
    # from the start (0: none) and at these offsets from each prompt's end. The end (0) lets the
    # next turn resume; a turn that rewrites up to 512 tail tokens resumes at the second.
    state_every_tokens: int = 0
    state_offsets_from_end: tuple[int, ...] = (0, 512)
    disk_tier_dir: str = ""
    # KV tiers under the device pools (kvfleet.kvstore.tiers); pages per life cycle come from
    # the GiB split like the device pools, unless *_pages fixes them.
    host_kv_gib: float = 0.0  # this rank's host tier; 0: none
    host_kv_pages: int | None = None
    host_kv_exclusive: bool = True  # a block onboarded from host leaves it: no block held twice
    # A request whose prefix has more host/disk pages than this, admitted while others decode,
    # brings them up this many a step before it joins (every page onboarded is a pause of the
    # whole batch: 0.19 ms a page on an H100, docs/engine.md); 0: all at its admission.
    onboard_pages_per_step: int = 256
    disk_tier_enabled: bool = True  # the shared disk tier in disk_tier_dir (when set)
    disk_kv_gib: float = 32.0  # this rank's share of the shared disk volume
    disk_kv_pages: int | None = None
    disk_prefetch_num_reqs: int = 4
    # Block files an admission reads at once, on threads of their own (the core thread waits
    # for them); 1: one after another on the core thread, until more is measured faster on a
    # GPU host (docs/tiers.md, "Reads").
    disk_read_threads: int = 1
    # Block files written by a thread of their own instead of the core thread, which plans and
    # launches every step (kvstore/tiers/write_behind.py): off until measured on a GPU fleet.
    disk_write_behind: bool = False
    torch_threads: int = 1
    # Decode steps through static buffers per batch-size bucket (cuda_graphs.py): "auto"
    # replays them as CUDA graphs on CUDA and runs plain eager steps elsewhere, "static" runs
    # the static-buffer path without capture (on any device), "off" never uses it.
    decode_graphs: str = "auto"
    # On CUDA: RMSNorm, RoPE and SwiGLU's product each as one torch.compile kernel (fused.py).
    fused_ops: bool = True
    # Plan the next decode step while the current one runs on the device (lookahead.py).
    # On by default: on the H200 it took 8b batch 64 from 5,476 to 5,970 tok/s and 1b batch
    # 256 from 18,455 to 24,206 in the same run (docs/engine-gpu.md).
    overlap_decode: bool = True
    # Disaggregation (kvfleet.services.disagg): how long a context rank keeps a parked
    # request's KV, how long a receiver waits for it, and the transports it tries in order.
    handoff_hold_seconds: float = 30.0
    handoff_timeout_seconds: float = 10.0
    handoff_transports: tuple[str, ...] = ("grpc", "disk")
    # From the operator's engine.yaml: ranks this pod runs (rank i on the base ports + i, on GPU
    # i) and a cap on the served model's context.
    ranks_per_pod: int = 1
    # Workers (GPUs) of one rank, splitting every layer (services/engine/tp): worker 0 serves,
    # the others follow its step plans; all of them started by the launcher (torchrun).
    tensor_parallel: int = 1
    max_model_len: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_num_batched_tokens", "page_size", "torch_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.decode_graphs not in DECODE_GRAPH_MODES:
            raise ValueError(
                f"decode_graphs must be one of {DECODE_GRAPH_MODES}, got {self.decode_graphs!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        check_kv_cache_dtype(self.kv_cache_dtype)
        if not 0 < self.gpu_memory_fraction <= 1:
            raise ValueError(
                f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}"
            )
        if self.cpu_kv_gib <= 0:
            raise ValueError(f"cpu_kv_gib must be > 0, got {self.cpu_kv_gib}")
        if self.onboard_pages_per_step < 0:
            raise ValueError(
                f"onboard_pages_per_step must be >= 0, got {self.onboard_pages_per_step}"
            )
        if (self.retained_conversations or 0) < 0:
            raise ValueError(
                f"retained_conversations must be >= 0, got {self.retained_conversations}"
            )
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.kv_pages is not None and self.kv_pages < 2:
            raise ValueError(
                f"kv_pages must be >= 2 (page 0 is the null page), got {self.kv_pages}"
            )
        pools = tuple(sorted(dict(self.kv_pool_pages).items()))
        object.__setattr__(self, "kv_pool_pages", pools)
        offsets = tuple(sorted(set(self.state_offsets_from_end)))  # engine.yaml gives a list
        object.__setattr__(self, "state_offsets_from_end", offsets)
        if self.state_every_tokens < 0 or any(offset < 0 for offset in offsets):
            raise ValueError(
                f"state_every_tokens and state_offsets_from_end must be >= 0, got "
                f"{self.state_every_tokens} and {offsets}"
            )
        small = {name: pages for name, pages in pools if pages < 2}
        if small:
            raise ValueError(f"kv_pool_pages must be >= 2 per pool (null page), got {small}")
        for name in ("host_kv_gib", "host_kv_pages", "disk_kv_gib", "disk_kv_pages"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.disk_read_threads < 1:
            raise ValueError(f"disk_read_threads must be >= 1, got {self.disk_read_threads}")
        if self.disk_prefetch_num_reqs < 0:
            raise ValueError(
                f"disk_prefetch_num_reqs must be >= 0, got {self.disk_prefetch_num_reqs}"
            )
        if self.sim_time_scale < 0:
            raise ValueError(f"sim_time_scale must be >= 0, got {self.sim_time_scale}")
        if self.ranks_per_pod < 1:
            raise ValueError(f"ranks_per_pod must be >= 1, got {self.ranks_per_pod}")
        self._check_tensor_parallel()
        if (self.max_model_len or 1) < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.max_num_turns < 1:
            raise ValueError(f"max_num_turns must be >= 1, got {self.max_num_turns}")
        if self.keep_branch_points < 0:
            raise ValueError(f"keep_branch_points must be >= 0, got {self.keep_branch_points}")

    def _check_tensor_parallel(self) -> None:
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        if self.tensor_parallel == 1:
            return
        needs = {
            "compute_backend 'torch'": self.compute_backend == "torch",
            "a model_path (a checkpoint to load by slices)": bool(self.model_path),
            "role 'both' (KV hand-off does not move shards yet)": self.role == "both",
            "no disk tier (disk_tier_enabled false: shards are not written to disk yet)": not (
                self.disk_tier_dir and self.disk_tier_enabled
            ),
        }
        missing = [what for what, ok in needs.items() if not ok]
        if missing:
            raise ValueError(f"tensor_parallel={self.tensor_parallel} needs {'; '.join(missing)}")

    def with_changes(self, **changes: Any) -> EngineConfig:
        """A copy with some fields replaced; None values are ignored (unset CLI flags)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
