"""Simulator settings (YAML, spec overrides) and the cost model's terms."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle
from kvfleet.services.core.cost_model import CostModel, StepWork
from kvfleet.services.replay.sim_config import (
    FleetOptions,
    SimConfigError,
    load_sim_config,
    parse_sim_spec,
)


def test_spec_parts() -> None:
    """If this fails, `sim:PATH?k=v` specs lose their file or their overrides."""
    assert parse_sim_spec("sim") == (None, {})
    assert parse_sim_spec("sim?ranks=2&affinity=lenient") == (
        None,
        {"ranks": "2", "affinity": "lenient"},
    )
    assert parse_sim_spec("sim:a/b.yaml?slots=3") == (Path("a/b.yaml"), {"slots": "3"})


def test_overrides_are_typed() -> None:
    """If this fails, query values reach the fleet as strings or wrong types."""
    config = load_sim_config(None, {"ranks": "3", "checkpoint": "off", "max_wait_seconds": "0.5"})
    assert (config.fleet.ranks, config.fleet.checkpoint, config.fleet.max_wait_seconds) == (
        3,
        False,
        0.5,
    )


def test_packaged_defaults_match_fleet_defaults() -> None:
    """If this fails, sim_costs.yaml and FleetOptions document different defaults."""
    assert load_sim_config().fleet == FleetOptions()


def test_yaml_file_merges_per_section(tmp_path: Path) -> None:
    """If this fails, a partial YAML file wipes the defaults it does not mention."""
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "fleet: {ranks: 2, host_pages: 100}\n"
        "model:\n  life_cycles:\n    - {kind: full, name: full}\n"
        "    - {kind: window, name: swa, window_tokens: 1024, replay_tokens: 128}\n"
    )
    config = load_sim_config(path, {"slots": "5"})
    assert (config.fleet.ranks, config.fleet.host_pages, config.fleet.slots) == (2, 100, 5)
    assert config.hardware.matmul_tflops == 738.0
    assert config.model.build_life_cycles() == (
        FullLifeCycle("full"),
        WindowLifeCycle("swa", 1024, 128),
    )


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"ranks": "0"}, "fleet.ranks: 0 must be >= 1"),
        ({"slots": "two"}, "slots='two' is not a int"),
        ({"checkpoint": "maybe"}, "checkpoint='maybe' is not a bool"),
        ({"gpu_pages": "1"}, "gpu_pages: 1 must be >= 2"),
        ({"kv_cache_dtype": "fp8"}, "fleet.kv_cache_dtype: 'fp8' not in"),
    ],
)
def test_bad_values_name_the_field(overrides: dict[str, str], match: str) -> None:
    """If this fails, a bad sim option is accepted or its error hides which one."""
    with pytest.raises(SimConfigError, match=match):
        load_sim_config(None, overrides)


def test_unknown_yaml_section_is_refused(tmp_path: Path) -> None:
    """If this fails, a misspelt section of a YAML file is silently ignored."""
    path = tmp_path / "bad.yaml"
    path.write_text("flete: {ranks: 2}\n")
    with pytest.raises(SimConfigError, match="unknown sections"):
        load_sim_config(path)


def costs() -> CostModel:
    config = load_sim_config()
    return CostModel.from_figures(config.model, config.hardware, config.fleet.block_size)


def test_prefill_attention_term_grows_with_context() -> None:
    """If this fails, prefill of a chunk costs the same at any depth (no attention term)."""
    model = costs()
    shallow = model.step_seconds(StepWork(prefill_spans=((0, 4096),)))
    deep = model.step_seconds(StepWork(prefill_spans=((100_000, 104_096),)))
    linear = 4096 * model.linear_s_per_token
    assert deep - shallow == pytest.approx(
        (model.attention_pairs(100_000, 104_096) - model.attention_pairs(0, 4096))
        * model.attention_s_per_pair
    )
    assert deep > 2 * shallow > 2 * linear


def test_decode_step_grows_with_batch_context_not_weights() -> None:
    """If this fails, decode steps ignore KV reads or charge the weights once per request."""
    model = costs()
    one = model.decode_seconds([1000])
    eight = model.decode_seconds([1000] * 8)
    assert eight - one == pytest.approx(7 * 1000 * model.decode_kv_s_per_token)
    assert one == pytest.approx(
        model.step_overhead_s + model.weights_read_s + 1000 * model.decode_kv_s_per_token
    )


def test_copy_costs_per_tier() -> None:
    """If this fails, onboarding from host or disk is free or priced alike."""
    model = costs()
    base = model.step_seconds(StepWork(prefill_spans=((0, 64),)))
    host = model.step_seconds(StepWork(prefill_spans=((0, 64),), host_pages_in=10))
    disk = model.step_seconds(StepWork(prefill_spans=((0, 64),), disk_pages_in=10))
    assert host - base == pytest.approx(10 * model.host_copy_s_per_page)
    assert disk - base > host - base > 0


def test_default_figures_for_an_8b_model_on_h200() -> None:
    """If this fails, the documented default per-unit costs changed without the docs."""
    model = costs()
    assert model.linear_s_per_token == pytest.approx(16e9 / 738e12)
    assert model.prefill_chunk_s == pytest.approx(0.0167)
    assert model.weights_read_s == pytest.approx(16e9 / 4e12)
    assert model.decode_kv_s_per_token == pytest.approx(131072 / 2e12)
    assert model.host_copy_s_per_page == pytest.approx(131072 * 64 / 50e9)


def test_prefill_matches_measured_h200_ttft() -> None:
    """If this fails, the prefill cost no longer matches the engine's measured 8b TTFTs on one
    H200 (docs/engine-gpu.md: a 32k prompt in 8k chunks 1,214 ms uncached, 97.2 ms with 95 %
    cached); the attention term is what makes the uncached one grow faster than linear."""
    model = costs()
    prompt, chunk = 32768, 8192
    uncached = sum(
        model.step_seconds(StepWork(prefill_spans=((start, start + chunk),)))
        for start in range(0, prompt, chunk)
    )
    cached = int(prompt * 0.95) // 64 * 64
    warm = model.step_seconds(StepWork(prefill_spans=((cached, prompt),)))
    assert uncached == pytest.approx(1.214, rel=0.02)
    assert warm == pytest.approx(0.0972, rel=0.02)


def test_cached_prefill_saves_what_the_h200_measured() -> None:
    """If this fails, the model prices a cached prompt cheaper (or dearer) against a cold one
    than the H200 measured (1,214 / 97.2 ms = 12.5x; the benches' throughput ratios come from
    this ratio): without the per-chunk cost it was 14.9x."""
    model = costs()
    prompt, chunk = 32768, 8192
    uncached = sum(
        model.step_seconds(StepWork(prefill_spans=((start, start + chunk),)))
        for start in range(0, prompt, chunk)
    )
    cached = int(prompt * 0.95) // 64 * 64
    warm = model.step_seconds(StepWork(prefill_spans=((cached, prompt),)))
    assert uncached / warm == pytest.approx(1.214 / 0.0972, rel=0.03)


def test_an_fp8_fleet_holds_twice_the_pages_in_the_same_bytes() -> None:
    """If this fails, the simulator sizes an fp8 fleet's tiers at bf16 page bytes (and the
    fp8-vs-bf16 comparison in docs/engine-gpu.md compares equal fleets)."""
    from kvfleet.services.replay.sim_sizing import rank_kvstore

    sized = {"gpu_gib": "4", "host_gib": "2", "slots": "2", "retained_conversations": "2"}
    bf16 = load_sim_config(None, {**sized, "kv_cache_dtype": "bf16"})
    fp8 = load_sim_config(None, {**sized, "kv_cache_dtype": "fp8_e4m3"})
    assert load_sim_config(None, sized).page_bytes() == bf16.page_bytes()  # auto: dtype_bytes 2
    assert {k: 2 * v for k, v in fp8.page_bytes().items()} == bf16.page_bytes()
    (bf16_store, bf16_tiers), (fp8_store, fp8_tiers) = (
        rank_kvstore(config.fleet, config.model) for config in (bf16, fp8)
    )
    for name, pages in bf16_store.pool_pages.items():
        assert abs(fp8_store.pool_pages[name] - 2 * pages) <= 1
        assert abs(fp8_tiers.host.capacity[name] - 2 * bf16_tiers.host.capacity[name]) <= 1
    bf16_costs, fp8_costs = (
        CostModel.from_figures(c.model, c.hardware, 64, c.kv_dtype_bytes()) for c in (bf16, fp8)
    )
    assert fp8_costs.host_copy_s_per_page == pytest.approx(bf16_costs.host_copy_s_per_page / 2)
    # the GPU's decode kernel reads the fp8 pages as they are: half the bytes
    assert fp8_costs.decode_kv_s_per_token == pytest.approx(bf16_costs.decode_kv_s_per_token / 2)


def test_a_few_long_decodes_read_at_their_programs_rate() -> None:
    """If this fails, a decode step of few sequences reads KV at the chip's whole bandwidth
    under an unsplit kernel (flash-attn's decode keeps one multiprocessor per sequence and KV
    head busy), or the split kernel (every cache by default, fp8 always) is priced as
    unsplit."""
    figures = load_sim_config(None, {})
    hardware = dataclasses.replace(figures.hardware, decode_program_gb_s=20.0, decode_split=False)
    bf16 = CostModel.from_figures(figures.model, hardware, 64)
    fp8 = CostModel.from_figures(figures.model, hardware, 64, kv_dtype_bytes=1)
    split_bf16 = CostModel.from_figures(
        figures.model, dataclasses.replace(hardware, decode_split=True), 64
    )
    assert split_bf16.decode_kv_seconds((100_000, 40_000)) == pytest.approx(
        140_000 * split_bf16.decode_kv_s_per_token
    )
    kv_per_head = 2 * figures.model.layers * figures.model.head_dim * figures.model.dtype_bytes
    # 2 sequences x 8 KV heads: 16 programs, the longest one's bytes at 20 GB/s
    assert bf16.decode_kv_seconds((100_000, 40_000)) == pytest.approx(100_000 * kv_per_head / 20e9)
    # split until 2 x 132 programs (16 parts of half the bytes): the chip's bandwidth binds
    split = 100_000 * kv_per_head / 2 / 16 / 20e9
    chip = 140_000 * fp8.decode_kv_s_per_token
    assert split < chip == pytest.approx(fp8.decode_kv_seconds((100_000, 40_000)))
    # many sequences: the chip's bandwidth is the bound again, as without a program rate
    wide = (2_000,) * 256
    plain = CostModel.from_figures(figures.model, figures.hardware, 64)
    assert bf16.decode_kv_seconds(wide) == pytest.approx(plain.decode_kv_seconds(wide))
    assert plain.decode_kv_seconds((100_000, 40_000)) == pytest.approx(
        140_000 * plain.decode_kv_s_per_token
    )
