"""ai-dynamo-runtime's router (bench/dynamo_router.py, its own venv) in front of real sim ranks."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import httpx
import pytest
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from peers_testkit import SIM_CONFIG, free_port, start_router, stop_process, tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]
DYNAMO_PYTHON = ROOT / ".venv-dynamo" / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not DYNAMO_PYTHON.exists(), reason="no .venv-dynamo (ai-dynamo-runtime==1.6.1, docs/peers.md)"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("dynamo-router"))


@pytest.fixture
def ranks(model_dir):
    """Two fresh sim ranks (empty caches) for one test."""
    config = dataclasses.replace(SIM_CONFIG, model_path=str(model_dir))
    started = [
        EngineRank(config, RankAddresses(http_port=0, rank_id=f"dynamo-worker-{i}")).start()
        for i in range(2)
    ]
    yield started
    for rank in started:
        rank.core.check_integrity()
        rank.stop(grace=0.5)


def _start(policy: str, ranks, model_dir: Path, workdir: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    command = [
        str(DYNAMO_PYTHON),
        str(ROOT / "bench" / "dynamo_router.py"),
        *("--port", str(port), "--policy", policy, "--block-size", str(SIM_CONFIG.page_size)),
        *("--model-path", str(model_dir), "--workdir", str(workdir), "--worker-urls"),
        *(f"http://127.0.0.1:{rank.http_port}" for rank in ranks),
    ]
    return start_router(command, port, workdir / "router.log"), port


def _streamed_usage(client: httpx.Client, port: int, prompt: list[int]) -> tuple[str, dict]:
    """One streamed completion through the router: (its text, its final usage)."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 4,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text, usage = "", None
    with client.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = httpx.Response(200, content=line[5:].strip()).json()
            text += "".join(choice.get("text", "") for choice in chunk.get("choices", []))
            usage = chunk.get("usage") or usage
    return text, usage


@pytest.mark.parametrize("policy", ["kv_router", "radix_tree"])
def test_second_turn_lands_on_its_prefix(policy, ranks, model_dir, tmp_path):
    """Dynamo's prefix index must send a conversation's second turn to the rank holding turn 1."""
    router, port = _start(policy, ranks, model_dir, tmp_path)
    prompt = list(range(40, 140))
    try:
        with httpx.Client(timeout=30) as client:
            text, first = _streamed_usage(client, port, prompt)
            _, second = _streamed_usage(client, port, [*prompt, *text.encode(), 7, 8])
    finally:
        stop_process(router)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert (second["prompt_tokens"], second["prompt_tokens_details"]["cached_tokens"]) == (106, 96)


def test_text_prompt_is_refused(ranks, model_dir, tmp_path):
    """The front hashes token ids only; a text prompt must get HTTP 400, not a wrong route."""
    router, port = _start("radix_tree", ranks, model_dir, tmp_path)
    try:
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 2},
            timeout=10,
        )
    finally:
        stop_process(router)
    assert answer.status_code == 400
    assert "list of token ids" in answer.json()["error"]["message"]
