"""The grpc:// target against a real router (port 0) fronting fake prefix-cache ranks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kvfleet.services.cli import main
from kvfleet.services.replay.claude_code import read_claude_code
from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.grpc_target import RouterGenerateTarget
from kvfleet.services.replay.readers import filter_max_model_len
from kvfleet.services.replay.runner import run_arm
from kvfleet.services.replay.target import open_target
from kvfleet.services.replay.target_types import TargetError
from kvfleet.services.replay.tokens import TokenSynthesizer
from kvfleet.services.router.admission import AdmissionConfig
from kvfleet.services.router.server import RouterConfig, create_server
from replay_fake_rank import PrefixCacheRank
from replay_paths import CLAUDE_CODE

SESSION = CLAUDE_CODE / "trace_0002.json"


@contextmanager
def router_with_ranks(count: int) -> Iterator[tuple[str, list[PrefixCacheRank]]]:
    """A router on a loopback port with `count` registered fake ranks."""
    config = RouterConfig(admission=AdmissionConfig(heartbeat_timeout_seconds=600.0))
    server, port = create_server("127.0.0.1:0", config=config)
    ranks = [PrefixCacheRank(f"rank-{i}") for i in range(count)]
    try:
        for rank in ranks:
            rank.register(f"127.0.0.1:{port}")
        yield f"grpc://127.0.0.1:{port}", ranks
    finally:
        server.stop(0)
        for rank in ranks:
            rank.stop()


async def test_generation_carries_cached_tokens_from_usage() -> None:
    """If this fails, the grpc target drops the engine's cached tokens or its token timings."""
    with router_with_ranks(1) as (url, _ranks):
        target = open_target(url)
        assert isinstance(target, RouterGenerateTarget)
        try:
            first = await target.generate("c1", list(range(200)), 3)
            second = await target.generate("c1", list(range(300)), 2)
        finally:
            await target.aclose()
    assert (first.prompt_tokens, first.cached_tokens, first.output_tokens) == (200, 0, 3)
    assert (second.prompt_tokens, second.cached_tokens, second.output_tokens) == (300, 192, 2)
    assert len(second.token_times_s) == 2
    assert second.first_token_s == second.token_times_s[0] <= second.finish_s


async def test_replay_through_router_reaches_oracle() -> None:
    """If this fails, turns do not reach the router with their conversation and token prefix."""
    conversations = filter_max_model_len([read_claude_code(SESSION)], 20000)
    with router_with_ranks(2) as (url, ranks):
        target = open_target(url)
        try:
            result = await run_arm(
                "grpc",
                target,
                conversations,
                TokenSynthesizer(1, 32000),
                DriverOptions(sessions=1, time_scale=0.0, stagger_s=0.0),
                {},
            )
        finally:
            await target.aclose()
    assert not result.errors
    assert result.measures.prefix_reuse == pytest.approx(result.measures.oracle_reuse)
    served = [rank for rank in ranks if rank.conversations]
    assert len(served) == 1  # one conversation stays pinned to one rank


async def test_router_refusal_is_a_target_error() -> None:
    """If this fails, a router error escapes as a raw gRPC exception and kills the replay."""
    with router_with_ranks(1) as (url, _ranks):
        target = open_target(url)
        try:
            with pytest.raises(TargetError, match="INVALID_ARGUMENT"):
                await target.generate("c1", [], 3)
        finally:
            await target.aclose()


def test_cli_writes_json_for_grpc_target(tmp_path: Path) -> None:
    """If this fails, `kvfleet replay --target grpc://...` does not write the measures."""
    out = tmp_path / "grpc.json"
    with router_with_ranks(1) as (url, _ranks):
        code = main(
            [
                "replay", str(SESSION), "--target", url, "--time-scale", "0",
                "--max-model-len", "20000", "--no-progress", "--json", str(out),
            ]
        )  # fmt: skip
    assert code == 0
    payload = json.loads(out.read_text())
    assert payload["requests"] > 1
    assert payload["prefix_reuse"] == pytest.approx(payload["oracle_reuse"])
