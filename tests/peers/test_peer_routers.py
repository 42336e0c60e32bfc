"""Real peer routers (the optional `peers` extra) in front of a real sim rank, on loopback."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import httpx
import pytest
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from peers_testkit import SIM_CONFIG, free_port, start_router, stop_process, tiny_model_dir

BIN = Path(sys.executable).parent


def _metrics_flags() -> list[str]:
    """Keep the router's Prometheus listener on loopback and off its fixed default port."""
    return ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]


def _sglang(port: int, worker: str) -> list[str]:
    return [
        str(BIN / "python"),
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        "cache_aware",
        "--worker-urls",
        worker,
        *_metrics_flags(),
    ]


def _vllm(port: int, worker: str) -> list[str]:
    return [
        str(BIN / "vllm-router"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        "cache_aware",
        "--worker-urls",
        worker,
        *_metrics_flags(),
    ]


@pytest.fixture(scope="module")
def rank(tmp_path_factory):
    model_dir = tiny_model_dir(tmp_path_factory.mktemp("peer-routers"))
    config = dataclasses.replace(SIM_CONFIG, model_path=str(model_dir))
    rank = EngineRank(config, RankAddresses(http_port=0, rank_id="peer-worker")).start()
    yield rank
    rank.core.check_integrity()
    rank.stop(grace=0.5)


def _two_turns(port: int, first_prompt, extend) -> tuple[dict, dict]:
    """Turn 1, then turn 2 = turn 1's prompt + its output + more; both usages."""
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"model": "tiny", "prompt": first_prompt, "max_tokens": 4, "temperature": 0.0}
    with httpx.Client(timeout=30) as client:
        first = client.post(url, json=body)
        assert first.status_code == 200, first.text
        body["prompt"] = extend(first_prompt, first.json()["choices"][0]["text"])
        second = client.post(url, json=body)
        assert second.status_code == 200, second.text
    return first.json()["usage"], second.json()["usage"]


def test_sglang_router_serves_text_prompts_with_reuse(rank, tmp_path):
    """sglang-router must register a sim rank (server/model info, local tokenizer) and route."""
    if shutil.which("sglang-router", path=str(BIN)) is None:
        pytest.skip("sglang-router not installed (optional extra 'peers')")
    port = free_port()
    router = start_router(_sglang(port, f"http://127.0.0.1:{rank.http_port}"), port, tmp_path / "r")
    try:
        first, second = _two_turns(port, "s" * 100, lambda p, out: p + out + "yz")
    finally:
        stop_process(router)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert (second["prompt_tokens"], second["prompt_tokens_details"]["cached_tokens"]) == (106, 96)
    rank.core.check_integrity()


def test_vllm_router_serves_token_prompts_with_reuse(rank, tmp_path):
    """vllm-router's cache_aware must render prompts through the rank and route token ids."""
    if shutil.which("vllm-router", path=str(BIN)) is None:
        pytest.skip("vllm-router not installed (optional extra 'peers')")
    port = free_port()
    router = start_router(_vllm(port, f"http://127.0.0.1:{rank.http_port}"), port, tmp_path / "r")
    prompt = list(range(40, 140))
    try:
        first, second = _two_turns(port, prompt, lambda p, out: [*p, *out.encode(), 7, 8])
    finally:
        stop_process(router)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert (second["prompt_tokens"], second["prompt_tokens_details"]["cached_tokens"]) == (106, 96)
    rank.core.check_integrity()
