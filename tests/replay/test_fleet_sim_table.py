"""bench/fleet_sim.py's table: draws and simulator runs pooled per arm, gaps of the means."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kvfleet.services.replay.sim_config import load_sim_config

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # fleet_sim imports its sibling bench modules by name
import fleet_sim  # noqa: E402
import sim_yaml  # noqa: E402

sys.path.remove(str(BENCH))


def measures(reuse: float, tok_s: float) -> dict:
    return {"prefix_reuse": reuse, "oracle_reuse": 1.0, "output_tok_per_s": tok_s}


def test_a_cell_is_the_mean_and_range_of_several_runs():
    assert fleet_sim.cell("{:.1f}", [2.0]) == "2.0"
    assert fleet_sim.cell("{:.1f}", [1.0, 2.0, 6.0]) == "3.0 (1.0-6.0)"


def test_the_gap_is_between_the_means_of_the_draws_and_of_the_runs():
    """One draw against one run would read a placement swing as a cost model error."""
    rows = {"defaults": ([measures(0.9, 100), measures(1.0, 140)],
                         [measures(0.94, 128), measures(0.96, 136)])}  # fmt: skip
    line = fleet_sim.table(rows).splitlines()[2]
    assert "0.950 (0.900-1.000) / 0.950 (0.940-0.960) (+0.0%)" in line
    assert "120 (100-140) / 132 (128-136) (+10.0%)" in line


def test_folders_of_another_fleet_are_refused(tmp_path, monkeypatch):
    """Pooling draws of different sizes would average two different fleets."""
    for name, gib in (("a", 6.7), ("b", 8.0)):
        (tmp_path / name).mkdir()
        fleet = {"ranks": 4, "gpu_gib_per_rank": gib, "arms": {}, "per_rank": {}}
        (tmp_path / name / "fleet.json").write_text(json.dumps(fleet))
    monkeypatch.setattr(sys, "argv", ["fleet_sim", "--hw", str(tmp_path / "a"),
                                      str(tmp_path / "b")])  # fmt: skip
    with pytest.raises(SystemExit, match="not the fleet of"):
        fleet_sim.main()


def test_hardware_figures_change_only_the_named_ones_of_the_yaml(tmp_path):
    """If this fails, `--hardware k=v` runs the simulator on other figures than the named
    YAML's with those changed (the docs' commands would not give their tables), or takes a
    malformed item silently."""
    chip = BENCH / "gpu" / "sim_1b_h100_chip.yaml"
    assert sim_yaml.with_hardware_figures(chip, "", tmp_path) == chip
    merged = sim_yaml.with_hardware_figures(
        chip, "admit_ms_per_host_page=0.178,admit_ms_per_disk_page=1.14", tmp_path
    )
    before, after = load_sim_config(chip), load_sim_config(merged)
    assert (after.hardware.admit_ms_per_host_page, after.hardware.admit_ms_per_disk_page) == (
        0.178,
        1.14,
    )
    assert after.hardware.prefill_chunk_ms == before.hardware.prefill_chunk_ms == 35.0
    assert (after.model, after.fleet) == (before.model, before.fleet)
    for bad in ("admit_ms_per_host_page", "admit_ms=fast"):
        with pytest.raises(ValueError, match="is not k=NUMBER"):
            sim_yaml.with_hardware_figures(chip, bad, tmp_path)
