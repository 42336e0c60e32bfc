"""`kvfleet replay` against the fleet `kvfleet up` starts: the README's path for a new user.

The fleet is a real `EmbeddedFleet` (router, two engine ranks, the OpenAI front) on loopback
ports; `--compute-backend sim` ranks run the real scheduler and KV store without tensors, so
an 8B-shaped model takes real Claude Code prompts on a CPU machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvfleet.services.cli import main
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig
from replay_cache_server import running_server
from replay_paths import CLAUDE_CODE

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

SHORT_SESSION = CLAUDE_CODE / "trace_0242.json"  # 3 turns of 15k-20k prompt tokens


def sim_fleet(model: str) -> Iterator[EmbeddedFleet]:
    engine = EngineConfig(
        model=model,
        compute_backend="sim",
        sim_time_scale=0.0,
        max_batch_size=2,
        max_num_batched_tokens=8192,
    )
    fleet = EmbeddedFleet(FleetConfig(engine, num_ranks=2, redis_url=None))
    try:
        yield fleet.start(timeout=60.0)
    finally:
        fleet.stop()


@pytest.fixture
def fleet_8b() -> Iterator[EmbeddedFleet]:
    yield from sim_fleet("8b")


@pytest.fixture
def fleet_tiny() -> Iterator[EmbeddedFleet]:
    yield from sim_fleet("tiny")


def replay(target: str, out: Path, *extra: str) -> int:
    return main(
        ["replay", str(SHORT_SESSION), "--target", target, "--json", str(out),
         "--time-scale", "0", "--stagger", "0", "--no-progress", *extra]
    )  # fmt: skip


def test_replay_takes_the_url_up_prints_and_the_models_vocabulary(
    fleet_8b: EmbeddedFleet, tmp_path: Path
) -> None:
    """If this fails, the README's replay against `kvfleet up` does not run as written: the
    printed `.../v1` URL is refused, or token ids ignore the served model's vocabulary."""
    assert fleet_8b.http_base_url.endswith("/v1")
    out = tmp_path / "out.json"
    assert replay(fleet_8b.http_base_url, out) == 0
    payload = json.loads(out.read_text())
    assert payload["requests"] == 3
    assert payload["config"]["vocab_size"] == 128256  # the 8b preset's, from /v1/models
    assert payload["config"]["max_model_len"] == 131072
    assert payload["reused_tokens"] > 0 and payload["later_turns_no_reuse"] == 0.0


def test_replay_says_so_and_exits_two_when_no_turn_fits(
    fleet_tiny: EmbeddedFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """If this fails, a model whose context no turn fits replays nothing and exits 0."""
    assert replay(fleet_tiny.http_base_url, tmp_path / "out.json") == 2
    err = capsys.readouterr().err
    assert "none of the 3 turns fits in 4096 tokens" in err
    assert "--compute-backend sim --model 8b" in err


def test_explicit_max_model_len_that_drops_everything_exits_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """If this fails, `--max-model-len` below every turn silently replays 0 requests."""
    with running_server() as (url, _cache, log):
        assert replay(url, tmp_path / "out.json", "--max-model-len", "4096") == 2
    assert "(--max-model-len)" in capsys.readouterr().err
    assert not log.bodies


def test_replay_stops_early_when_every_request_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """If this fails, a target that refuses everything is paced through the whole trace (all
    of its think times) before the user learns anything."""
    session = CLAUDE_CODE / "trace_0460.json"  # 12 turns
    with running_server(fail_status=400) as (url, _cache, log):
        code = main(
            ["replay", str(session), "--target", url, "--give-up-after", "2",
             "--time-scale", "0", "--stagger", "0", "--no-progress"]
        )  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "stopped, the first 2 requests all failed" in err and "HTTP 400" in err
    assert len(log.bodies) == 2
