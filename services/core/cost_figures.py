"""The figures a step's cost is computed from: the model's shape and the rank's hardware.

Both the `sim` compute backend (an engine rank without tensors) and the fleet simulator price
steps with them, so they live below both. Defaults come from the packaged `sim_costs.yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ...kvstore.life_cycles import (
    FullLifeCycle,
    PrivateLifeCycle,
    StateLifeCycle,
    WindowLifeCycle,
)

DEFAULTS_RESOURCE = "sim_costs.yaml"

# kind -> life cycle class, for the YAML's `model.life_cycles` entries.
LIFE_CYCLE_KINDS: dict[str, type] = {
    "full": FullLifeCycle,
    "window": WindowLifeCycle,
    "private": PrivateLifeCycle,
    "state": StateLifeCycle,
}


class SimConfigError(ValueError):
    """A simulator setting is missing, unknown or out of range."""


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of the model: sizes and the kvstore life cycles."""

    name: str
    params_billion: float
    layers: int
    query_heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    life_cycles: tuple[dict[str, Any], ...] = ({"kind": "full", "name": "full"},)

    def build_life_cycles(self) -> tuple:
        """The kvstore life cycle objects of `life_cycles`."""
        built = []
        for entry in self.life_cycles:
            params = dict(entry)
            params.pop("layers", None)  # page bytes only (`page_bytes`)
            params.pop("state_bytes", None)
            kind = params.pop("kind", None)
            if kind not in LIFE_CYCLE_KINDS:
                raise SimConfigError(
                    f"model.life_cycles: kind {kind!r} not in {sorted(LIFE_CYCLE_KINDS)}"
                )
            if "offsets_from_end" in params:
                params["offsets_from_end"] = tuple(params["offsets_from_end"])
            built.append(LIFE_CYCLE_KINDS[kind](**params))
        return tuple(built)

    def page_bytes(self, block_size: int, kv_dtype_bytes: int | None = None) -> dict[str, int]:
        """Bytes of one page per life cycle: its layers (an entry's `layers`, else the
        model's layers split evenly between the entries) x, for attention, K and V x kv heads
        x head dim x block size x `kv_dtype_bytes` (default: the model's `dtype_bytes`), and
        for a state entry its `state_bytes` (one layer's recurrent state, in any KV dtype;
        default: as attention, which understates an SSM snapshot)."""
        named = [entry.get("layers") for entry in self.life_cycles]
        given = sum(layers for layers in named if layers is not None)
        unnamed = sum(1 for layers in named if layers is None)
        if given > self.layers or (unnamed and given == self.layers):
            raise SimConfigError(
                f"model.life_cycles: layers {named} do not fit in the model's {self.layers}"
            )
        share = (self.layers - given) // unnamed if unnamed else 0
        element = kv_dtype_bytes or self.dtype_bytes
        per_layer = 2 * self.kv_heads * self.head_dim * element * block_size
        out = {}
        for entry in self.life_cycles:
            layer_bytes = entry.get("state_bytes", per_layer)
            if layer_bytes < 1:
                raise SimConfigError(f"model.life_cycles: {entry['name']}: state_bytes < 1")
            out[entry["name"]] = (entry.get("layers") or share) * layer_bytes
        return out


@dataclass(frozen=True)
class Hardware:
    """Throughput figures of one rank's accelerator and links."""

    matmul_tflops: float
    attention_tflops: float
    weights_read_tb_s: float
    decode_kv_read_tb_s: float
    host_link_gb_s: float
    disk_read_gb_s: float
    step_overhead_ms: float
    handoff_link_gb_s: float = 50.0  # context -> generation rank KV transfer
    prefill_chunk_ms: float = 0.0  # fixed cost per prefill chunk in a step
    # KV read rate of one decode program (one sequence's one KV head) alone: a decode step
    # with fewer programs than the chip has multiprocessors reads no faster than its longest
    # program (0: no such limit, every decode reads at decode_kv_read_tb_s).
    decode_program_gb_s: float = 0.0
    multiprocessors: int = 132
    # The decode kernel splits each sequence's keys over programs (the engine's Triton kernel,
    # any cache dtype); false: one program per (sequence, KV head) for a bf16 cache, as
    # flash-attn's paged decode ran in the fleet replays recorded before it.
    decode_split: bool = True
    # Ranks sharing one chip (`fleet.ranks_per_chip`): chip time a step costs extra when it
    # starts while another rank's step is on the chip (its context is switched in; 0: none).
    chip_switch_ms: float = 0.0
    # > 0: the shared chip runs one step at a time in round-robin slices of this long, as the
    # GPU's time-slice scheduler does (0: processor sharing); a prefill step's chip time is
    # `chip_prefill_kernels` kernels that a slice does not cut (0: cut anywhere).
    chip_slice_ms: float = 0.0
    chip_prefill_kernels: int = 0
    # Admission to the rank's queue: the host path each request takes (router pass, gRPC,
    # the engine's add), a fixed part and one per 1,000 prompt tokens (replay/sim_dispatch.py).
    dispatch_ms: float = 0.0
    dispatch_ms_per_ktoken: float = 0.0
    # The engine's add and admission of a request on its core thread (the prompt matched, pages
    # taken, the host tier's pages onboarded): the rank runs no step meanwhile, so its other
    # sequences' decodes wait; a fixed part per admitted request and one per page onboarded
    # from the host tier (replay/sim_dispatch.py).
    admit_ms: float = 0.0
    admit_ms_per_host_page: float = 0.0
    # ... and one per page read from the disk tier (the block file opened, read and checked
    # on the core thread). When set, that read is the disk page's cost and the step copies the
    # staged page to the device over the host link, as a host page (not at `disk_read_gb_s`).
    admit_ms_per_disk_page: float = 0.0
    # A piece of a waiting request's prefix brought up ahead of its admission (the engine's
    # `onboard_pages_per_step`), per host page: one draw of the H100 fleet's logs prices it
    # below an admission's page (0.104 ms against 0.165, docs/sim-vs-live.md). 0: the
    # admission's figure.
    piece_ms_per_host_page: float = 0.0
    # The engine writes blocks evicted from its host tier (or from the device, with no host
    # tier) to the disk tier on its core thread, at the kvstore's flush while it plans a step:
    # the step, and every running sequence, waits that long per block written.
    disk_write_ms_per_page: float = 0.0
    # The engine plans and launches a decode step while the one before runs on the device
    # (`overlap_decode`, services/engine/core/lookahead.py): a decode step that follows a
    # decode step of the same requests (none waiting, none ending) pays only the part of its
    # step overhead that outlasts the step before's chip time (replay/sim_rank.py). false:
    # every step's overhead comes after the step before has ended.
    decode_overlap: bool = False

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            may_be_zero = item.name in (
                "step_overhead_ms",
                "prefill_chunk_ms",
                "decode_program_gb_s",
                "decode_split",
                "chip_switch_ms",
                "chip_slice_ms",
                "chip_prefill_kernels",
                "dispatch_ms",
                "dispatch_ms_per_ktoken",
                "admit_ms",
                "admit_ms_per_host_page",
                "admit_ms_per_disk_page",
                "piece_ms_per_host_page",
                "disk_write_ms_per_page",
                "decode_overlap",
            )
            if value < 0 or (value == 0 and not may_be_zero):
                raise SimConfigError(f"hardware.{item.name}: {value} must be > 0")


def default_figures() -> dict[str, Any]:
    """The packaged `sim_costs.yaml` as plain data (sections model, hardware, fleet)."""
    return yaml.safe_load(resources.files(__package__).joinpath(DEFAULTS_RESOURCE).read_text())


def load_hardware(path: Path | None = None) -> Hardware:
    """The packaged hardware figures, with `hardware:` of the YAML at `path` over them."""
    raw = default_figures()["hardware"]
    if path is not None:
        extra = yaml.safe_load(Path(path).read_text()) or {}
        raw = {**raw, **(extra.get("hardware") or {})}
    try:
        return Hardware(**raw)
    except TypeError as error:
        raise SimConfigError(f"hardware: {error}") from error
