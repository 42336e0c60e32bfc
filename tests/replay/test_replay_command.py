"""`kvfleet replay` end to end: traces in, table, --json and --plot out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvfleet.services.cli import main
from kvfleet.services.replay.measures import MEASURE_FIELDS
from replay_cache_server import running_server
from replay_paths import CLAUDE_CODE, MOONCAKE_SYNTHETIC

PNG_MAGIC = b"\x89PNG"


def _check_fields(payload: dict) -> None:
    """Invariant: exactly the issue's fields; fractions in [0, 1]; reuse within the oracle."""
    assert list(payload) == [*MEASURE_FIELDS, "config"]
    for name in ("prefix_reuse", "oracle_reuse", "later_turns_no_reuse"):
        assert 0.0 <= payload[name] <= 1.0
    assert payload["prefix_reuse"] <= payload["oracle_reuse"]
    assert payload["reused_tokens"] <= payload["prompt_tokens"]


def test_claude_code_replay_writes_json_and_plots(tmp_path: Path) -> None:
    """If this fails, the command's JSON, table or plots are broken for Claude Code sessions."""
    out, plots = tmp_path / "out.json", tmp_path / "plots"
    with running_server() as (url, _cache, _log):
        code = main(
            [
                "replay",
                str(CLAUDE_CODE / "trace_0282.json"),
                str(CLAUDE_CODE / "trace_0002.json"),
                "--target", url,
                "--json", str(out),
                "--plot", str(plots),
                "--sessions", "2",
                "--time-scale", "0",
                "--stagger", "0",
                "--seed", "5",
                "--max-model-len", "32768",
                "--no-progress",
            ]
        )  # fmt: skip
    assert code == 0
    payload = json.loads(out.read_text())
    _check_fields(payload)
    assert payload["requests"] == 24 + 5  # 0282 and 0002 turns of at most 32768 tokens
    assert payload["prefix_reuse"] == payload["oracle_reuse"]  # one infinite cache
    assert payload["config"]["seed"] == 5 and payload["config"]["max_model_len"] == 32768
    assert payload["config"]["target"] == url
    for name in ("prefix_reuse_per_window.png", "ttft_cdf.png"):
        assert (plots / name).read_bytes()[:4] == PNG_MAGIC


def test_mooncake_replay_stays_under_oracle(tmp_path: Path) -> None:
    """If this fails, Mooncake replays lose their conversations or beat the oracle."""
    out = tmp_path / "out.json"
    with running_server() as (url, _cache, _log):
        code = main(
            [
                "replay", str(MOONCAKE_SYNTHETIC),
                "--target", url, "--json", str(out),
                "--sessions", "4", "--time-scale", "0", "--stagger", "0",
                "--limit", "30", "--max-model-len", "16384", "--no-progress",
            ]
        )  # fmt: skip
    assert code == 0
    payload = json.loads(out.read_text())
    _check_fields(payload)
    assert payload["later_turns"] > 0


def test_two_arms_compared_in_one_run(tmp_path: Path) -> None:
    """If this fails, several --target arms cannot be compared in one table, JSON, plot and
    per-request records."""
    out, plots, records = tmp_path / "out.json", tmp_path / "plots", tmp_path / "records.jsonl"
    with running_server() as (first, _c1, _l1), running_server() as (second, _c2, _l2):
        code = main(
            [
                "replay", str(CLAUDE_CODE / "trace_0002.json"),
                "--target", first, "--arm", "one",
                "--target", second, "--arm", "two",
                "--json", str(out), "--plot", str(plots), "--records", str(records),
                "--time-scale", "0", "--max-model-len", "20000", "--no-progress",
            ]
        )  # fmt: skip
    assert code == 0
    arms = json.loads(out.read_text())["arms"]
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    for name in ("one", "two"):  # every request of each arm, as the measures counted them
        mine = [line for line in lines if line["arm"] == name]
        assert len(mine) == arms[name]["requests"]
        assert sum(line["reused_tokens"] for line in mine) == arms[name]["reused_tokens"]
        assert all(line["first_token_s"] >= line["arrival_s"] for line in mine)
    assert list(arms) == ["one", "two"]
    for payload in arms.values():
        _check_fields(payload)
    assert arms["one"]["prefix_reuse"] == arms["two"]["prefix_reuse"]


def test_bad_sim_option_exits_with_clear_error(capsys: pytest.CaptureFixture) -> None:
    """If this fails, a mistyped simulator option crashes with a traceback."""
    code = main(["replay", str(CLAUDE_CODE / "trace_0002.json"), "--target", "sim?slotz=1"])
    assert code == 2
    assert "sim option 'slotz' unknown" in capsys.readouterr().err


def test_failed_requests_exit_nonzero(tmp_path: Path) -> None:
    """If this fails, a replay whose requests all failed reports success."""
    with running_server(fail_status=500) as (url, _cache, _log):
        code = main(
            [
                "replay", str(CLAUDE_CODE / "trace_0002.json"), "--target", url,
                "--time-scale", "0", "--max-model-len", "20000", "--no-progress",
            ]
        )  # fmt: skip
    assert code == 1


def test_records_name_the_rank_each_turn_ran_on(tmp_path: Path) -> None:
    """Without the rank, a replay's records cannot show which conversations shared a rank
    (the simulator names its rank; a kvfleet router's answers do too: test_chat_replay.py)."""
    records = tmp_path / "records.jsonl"
    code = main(
        [
            "replay", str(CLAUDE_CODE / "trace_0002.json"), str(CLAUDE_CODE / "trace_0282.json"),
            "--target", "sim?ranks=2", "--records", str(records), "--sessions", "2",
            "--time-scale", "0", "--max-model-len", "32768", "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    by_conversation: dict[str, set[str]] = {}
    for line in lines:
        by_conversation.setdefault(line["conversation_id"], set()).add(line["rank"])
    # strict affinity: every turn of a conversation on its one rank, one of the two
    assert all(len(ranks) == 1 for ranks in by_conversation.values())
    assert set().union(*by_conversation.values()) <= {"rank-0", "rank-1"}
