"""`--api text`: the replay's token ids sent as ASCII text to /v1/completions, for routers that
take no token ids (sglang-router). One byte is one token on a byte-tokenizer rank, so a replay
sent as text must measure what the same replay sent as ids does."""

from __future__ import annotations

import json

import pytest
from kvfleet.services.cli import main
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig
from kvfleet.services.replay.text_target import TEXT_VOCAB, TextCompletionsTarget
from replay_cache_server import running_server
from replay_paths import CLAUDE_CODE

SESSION = CLAUDE_CODE / "trace_0242.json"  # 3 turns of 15k-20k prompt tokens, no sub-agents


async def test_sends_the_ids_as_ascii_text_and_caps_the_vocabulary() -> None:
    """If this fails, a text-only router gets token ids, or ids past one byte reach it."""
    with running_server() as (url, _cache, log):
        target = TextCompletionsTarget(url, model="m", timeout_s=10)
        try:
            info = await target.describe()
            await target.generate("conv-3", [72, 105, 10, 0, 127], 1)
        finally:
            await target.aclose()
    (body,) = log.bodies
    assert (body["prompt"], body["user"], body["model"]) == ("Hi\n\x00\x7f", "conv-3", "m")
    assert info.vocab_size == TEXT_VOCAB


async def test_an_id_past_ascii_is_refused_before_sending() -> None:
    with running_server() as (url, _cache, log):
        target = TextCompletionsTarget(url, timeout_s=10)
        try:
            with pytest.raises(ValueError, match="--vocab-size <= 128"):
                await target.generate("c", [1, TEXT_VOCAB], 1)
        finally:
            await target.aclose()
    assert log.bodies == []


def test_a_vocabulary_past_the_targets_is_a_setup_error(tmp_path, capsys) -> None:
    """If this fails, `--api text --vocab-size 1000` fails every request one by one instead of
    saying which flag is wrong before the first."""
    with running_server() as (url, _cache, log):
        code = main(["replay", str(SESSION), "--target", url, "--api", "text", "--vocab-size",
                     "1000", "--no-progress", "--time-scale", "0"])  # fmt: skip
    assert code == 2
    assert "--vocab-size 1000" in capsys.readouterr().err and log.bodies == []


def replayed(tmp_path, name: str, *api: str) -> dict:
    """SESSION's first two turns on a fresh two-rank sim fleet with the byte tokenizer."""
    engine = EngineConfig(model="8b", compute_backend="sim", sim_time_scale=0.0,
                          max_batch_size=2, max_num_batched_tokens=8192)  # fmt: skip
    fleet = EmbeddedFleet(FleetConfig(engine, num_ranks=2, redis_url=None)).start(timeout=60.0)
    out = tmp_path / f"{name}.json"
    try:
        code = main(["replay", str(SESSION), "--target", fleet.http_base_url, "--json", str(out),
                     "--time-scale", "0", "--stagger", "0", "--no-progress", "--seed", "0",
                     "--max-turns", "2", "--model", "8b", *api])  # fmt: skip
    finally:
        fleet.stop()
    assert code == 0
    return json.loads(out.read_text())


@pytest.mark.slow  # a live two-rank fleet twice, two replays of 35k prompt tokens
def test_text_reuses_what_token_ids_do_on_a_live_fleet(tmp_path) -> None:
    """If this fails, the text a text-only router forwards does not tokenise back to the
    replay's ids: prompts change length, or turns stop sharing their prefix."""
    ids = replayed(tmp_path, "ids", "--vocab-size", str(TEXT_VOCAB))
    text = replayed(tmp_path, "text", "--api", "text")
    assert ids["requests"] == text["requests"] == 2
    assert text["config"]["vocab_size"] == TEXT_VOCAB
    assert text["prompt_tokens"] == ids["prompt_tokens"] > 30000
    assert text["reused_tokens"] == ids["reused_tokens"] > 10000
