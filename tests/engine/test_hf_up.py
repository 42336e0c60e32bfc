"""`kvfleet up --model-path DIR` serves a Hugging Face checkpoint end to end: its weights, its
tokenizer, its chat template (tools included) and its stop tokens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from kvfleet.services.engine.api.chat_template import render_chat
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.model.tiny_checkpoint import write_tiny_checkpoint
from kvfleet.services.engine.model.tokenizer import load_model_tokenizer
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

REPO = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-qwen3-moe",
                                 "Qwen3MoeForCausalLM", seed=3)  # fmt: skip


def test_fleet_answers_a_chat_request_with_the_models_template(checkpoint):
    """The HTTP front and the ranks must use the checkpoint's tokenizer, not the byte one."""
    engine = EngineConfig(model=checkpoint.name, model_path=str(checkpoint), max_batch_size=2)
    fleet = EmbeddedFleet(FleetConfig(engine, num_ranks=1, redis_url=None)).start()
    messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "hi"}]
    try:
        with httpx.Client(base_url=fleet.http_base_url, timeout=60) as client:
            reply = client.post("/chat/completions", json={
                "model": checkpoint.name, "messages": messages, "tools": TOOLS,
                "max_tokens": 6, "temperature": 0})  # fmt: skip
            assert reply.status_code == 200, reply.text
            body = reply.json()
            bad = client.post("/chat/completions", json={
                "model": "kvfleet", "messages": [{"role": "robot", "content": "x"}]})  # fmt: skip
    finally:
        fleet.stop()
    expected = render_chat(messages, load_model_tokenizer(checkpoint), tools=TOOLS)
    assert body["usage"]["prompt_tokens"] == len(expected)
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    assert bad.status_code == 400 and '"param":"messages[0].role"' in bad.text


def test_kvfleet_up_smoke_serves_a_model_dir(tmp_path):
    """The newcomer's path: model-dir --arch, then up --model-path, two turns that reuse KV."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "kvfleet.services.cli"]
    write = [*cli, "model-dir", "--arch", "LlamaForCausalLM", str(tmp_path / "m")]
    made = subprocess.run(write, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    result = subprocess.run(
        [*cli, "up", "--smoke", "--router-port", "0", "--http-port", "0", "--metrics-port", "0",
         "--model-path", str(tmp_path / "m")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(model m," in result.stdout and "smoke: ok" in result.stdout
