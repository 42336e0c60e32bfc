"""The endpoints peer routers call on a rank, served by a real sim rank over loopback HTTP."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from peers_testkit import SIM_CONFIG, tiny_model_dir


@pytest.fixture(scope="module")
def rank(tmp_path_factory):
    model_dir = tiny_model_dir(tmp_path_factory.mktemp("peers"))
    config = dataclasses.replace(SIM_CONFIG, model_path=str(model_dir))
    rank = EngineRank(config, RankAddresses(http_port=0, rank_id="worker-0")).start()
    with httpx.Client(base_url=f"http://127.0.0.1:{rank.http_port}", timeout=30) as client:
        yield rank, client, str(model_dir)
    rank.core.check_integrity()
    rank.stop(grace=0.5)


@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
def test_server_info_reports_the_local_model_path_and_block_size(rank, path):
    """sglang-router reads dp_size/model_path here and vllm-router the block size."""
    _rank, client, model_dir = rank
    info = client.get(path).json()
    assert (info["model_path"], info["tokenizer_path"], info["dp_size"]) == (
        model_dir,
        model_dir,
        1,
    )
    assert info["page_size"] == 16 and info["context_length"] == 4096
    assert info["max_total_num_tokens"] == 2 * 159 * 16  # two life cycles, 159 usable pages each
    assert info["vllm_config"]["cache_config"] == {"block_size": 16}
    assert info["vllm_config"]["model_config"]["model"] == model_dir


@pytest.mark.parametrize("path", ["/model_info", "/get_model_info"])
def test_model_info_points_routers_at_the_local_tokenizer(rank, path):
    """A router without a local tokenizer path tries to download one (no network here)."""
    _rank, client, model_dir = rank
    info = client.get(path).json()
    assert (info["model_path"], info["tokenizer_path"], info["is_generation"]) == (
        model_dir,
        model_dir,
        True,
    )


def test_get_load_reports_one_idle_dp_rank(rank):
    """Load-based peer policies read running/waiting counts per data-parallel rank."""
    _rank, client, _ = rank
    (load,) = client.get("/get_load").json()
    assert {k: load[k] for k in ("dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens")} == {
        "dp_rank": 0,
        "num_reqs": 0,
        "num_waiting_reqs": 0,
        "num_tokens": 0,
    }


def test_health_generate_runs_one_token(rank):
    """Routers mark a worker dead when its generate health check fails."""
    served, client, _ = rank
    response = client.get("/health_generate")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    served.core.check_integrity()


def test_tokenize_accepts_vllm_prompt_and_sglang_text(rank):
    """Tokenising routers send `prompt` (vLLM) or `text` (sglang); ids are the UTF-8 bytes."""
    _rank, client, _ = rank
    expected = {"tokens": list(b"h\xc3\xa9 !"), "count": 5, "max_model_len": 4096}
    assert client.post("/tokenize", json={"prompt": "hé !"}).json() == expected
    assert client.post("/tokenize", json={"text": "hé !"}).json() == expected


def test_tokenize_renders_messages_with_the_chat_template(rank):
    """Chat prompts must tokenise to what /v1/chat/completions feeds the engine."""
    _rank, client, _ = rank
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/tokenize", json=body).json()["tokens"] == [
        *list(b"user: hi\n"),
        *list(b"assistant: "),
    ]


def test_detokenize_returns_text_under_both_keys(rank):
    """vLLM clients read `prompt`, sglang ones `text`."""
    _rank, client, _ = rank
    body = client.post("/detokenize", json={"tokens": list(b"ok \xc3\xa9")}).json()
    assert body == {"prompt": "ok é", "text": "ok é"}


def test_completions_render_returns_engine_prompts(rank):
    """vllm-router's cache_aware tokenises every request through this endpoint."""
    _rank, client, _ = rank
    text = client.post("/v1/completions/render", json={"model": "tiny", "prompt": "ab"})
    ids = client.post("/v1/completions/render", json={"model": "tiny", "prompt": [5, 6, 7]})
    assert text.json() == [{"prompt_token_ids": [97, 98]}]
    assert ids.json() == [{"prompt_token_ids": [5, 6, 7]}]


def test_chat_render_matches_the_chat_template(rank):
    """A chat render that differs from the served prompt would misplace chat requests."""
    _rank, client, _ = rank
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    rendered = client.post("/v1/chat/completions/render", json=body).json()
    assert rendered == [{"prompt_token_ids": [*list(b"user: x\n"), *list(b"assistant: ")]}]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/v1/chat/completions/render", {"messages": "hi"}, "messages"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(rank, path, body, param):
    """A router must get a client error it can pass on, not a 500."""
    _rank, client, _ = rank
    response = client.post(path, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_completions_serve_text_prompts_through_the_local_tokenizer(rank):
    """Text prompts (what sglang-router forwards) must reuse KV like token-id prompts."""
    _rank, client, _ = rank
    headers = {"X-Conversation-Id": "text-a"}
    body = {"model": "tiny", "prompt": "x" * 100, "max_tokens": 4, "temperature": 0.0}
    first = client.post("/v1/completions", json=body, headers=headers).json()
    body["prompt"] = "x" * 100 + first["choices"][0]["text"] + "yz"
    second = client.post("/v1/completions", json=body, headers=headers).json()
    assert second["usage"]["prompt_tokens"] == 106
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
