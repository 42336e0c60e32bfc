"""`kvfleet replay ... --target sim` end to end: the JSON fields, reuse within the oracle."""

from __future__ import annotations

import json
from pathlib import Path

from kvfleet.services.cli import main
from kvfleet.services.replay.measures import MEASURE_FIELDS
from replay_paths import CLAUDE_CODE

SLICE = [str(CLAUDE_CODE / name) for name in ("trace_0002.json", "trace_0010.json")]


def test_cli_sim_writes_every_field(tmp_path: Path) -> None:
    """If this fails, CI cannot read a simulated replay's measures."""
    out = tmp_path / "sim.json"
    code = main(
        [
            "replay", *SLICE, "--target", "sim?ranks=2&slots=2&gpu_pages=3000",
            "--time-scale", "0", "--max-model-len", "40000", "--sessions", "2",
            "--no-progress", "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    payload = json.loads(out.read_text())
    assert list(payload) == [*MEASURE_FIELDS, "config"]
    assert payload["requests"] > 10
    assert 0 < payload["prefix_reuse"] <= payload["oracle_reuse"] <= 1
    assert payload["ttft_p50_s"] > 0
    assert payload["config"]["target"] == "sim?ranks=2&slots=2&gpu_pages=3000"


def test_cli_compares_sim_arms_in_one_run(tmp_path: Path) -> None:
    """If this fails, several sim arms cannot run one after another in one replay."""
    out = tmp_path / "arms.json"
    code = main(
        [
            "replay", SLICE[0], "--target", "sim?affinity=strict", "--arm", "strict",
            "--target", "sim?affinity=lenient", "--arm", "lenient", "--time-scale", "0",
            "--max-model-len", "40000", "--no-progress", "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    arms = json.loads(out.read_text())["arms"]
    assert list(arms) == ["strict", "lenient"]
    assert arms["strict"]["requests"] == arms["lenient"]["requests"] > 1
