"""The worker endpoints that peer routers (sglang-router, vllm-router) call on an engine rank.

They sit next to the OpenAI API on the rank's HTTP port (`add_worker_routes`):

| path                                            | read by                              |
|-------------------------------------------------|--------------------------------------|
| `/health_generate`                              | health checks: one generated token   |
| `/server_info`, `/get_server_info`              | dp_size, model path, block size      |
| `/model_info`, `/get_model_info`                | sglang-router: model/tokenizer path  |
| `/get_load`                                     | load policies: running/queued per dp |
| `/tokenize`, `/detokenize`                      | tokenising routers (sglang + vLLM)   |
| `/v1/completions/render`, `.../chat/.../render` | vllm-router cache_aware              |

`model_path` is a local directory (config.json + tokenizer.json, see `model_dir.py`), so a
router that loads the tokenizer from it never downloads one.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..api.chat_template import render_chat
from ..api.http_backends import BackendRequest, GenerateBackend
from ..api.openai_http import json_body
from ..request.engine_request import EngineLoad, InvalidRequestError
from ..request.sampling_params import SamplingParams

HEALTH_PROBE_TOKEN = 32  # a space in the byte vocabulary; any id < vocab_size would do


@dataclass(frozen=True)
class WorkerInfo:
    """What the worker endpoints report about a rank."""

    model_name: str
    model_path: str
    page_size: int
    max_model_len: int
    max_batch_size: int
    max_num_batched_tokens: int
    kv_capacity_pages: int
    load: Callable[[], EngineLoad]

    def server_info(self) -> dict[str, Any]:
        """sglang's server args (the keys its router reads) plus vLLM's `vllm_config` layout."""
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.model_name,
            "is_generation": True,
            "tp_size": 1,
            "dp_size": 1,
            "load_balance_method": "round_robin",
            "disaggregation_mode": "null",
            "page_size": self.page_size,
            "context_length": self.max_model_len,
            "max_batch_size": self.max_batch_size,
            "max_running_requests": self.max_batch_size,
            "max_num_reqs": self.max_batch_size,
            "max_prefill_tokens": self.max_num_batched_tokens,
            "max_total_num_tokens": self.kv_capacity_pages * self.page_size,
            "vllm_config": {
                "model_config": {
                    "model": self.model_path or self.model_name,
                    "served_model_name": self.model_name,
                    "max_model_len": self.max_model_len,
                },
                "cache_config": {"block_size": self.page_size},
                "scheduler_config": {
                    "max_num_seqs": self.max_batch_size,
                    "max_num_batched_tokens": self.max_num_batched_tokens,
                },
            },
        }

    def model_info(self) -> dict[str, Any]:
        """sglang's `/get_model_info`."""
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.model_name,
            "is_generation": True,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "max_context_length": self.max_model_len,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }

    def load_report(self) -> list[dict[str, Any]]:
        """sglang's `/get_load`: one entry per data-parallel rank (this rank is one)."""
        load = self.load()
        return [
            {
                "dp_rank": 0,
                "num_reqs": load.running + load.queued,
                "num_running_reqs": load.running,
                "num_waiting_reqs": load.queued,
                "num_tokens": round(load.kv_usage * self.kv_capacity_pages * self.page_size),
                "kv_usage": load.kv_usage,
            }
        ]


def add_worker_routes(app: FastAPI, backend: GenerateBackend, info: WorkerInfo) -> FastAPI:
    """Mount the peer-router endpoints on `app` (the rank's OpenAI app)."""
    tokenizer = backend.tokenizer

    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, info.server_info, methods=["GET"])
    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, info.model_info, methods=["GET"])
    app.add_api_route("/get_load", info.load_report, methods=["GET"])

    @app.get("/health_generate")
    async def health_generate() -> JSONResponse:
        probe = BackendRequest(
            request_id=f"health-{uuid.uuid4().hex}",
            prompt_token_ids=(HEALTH_PROBE_TOKEN,),
            sampling=SamplingParams(temperature=0.0, max_tokens=1),
        )
        tokens = [t async for output in backend.generate(probe) for t in output.token_ids]
        if len(tokens) != 1:
            return JSONResponse({"status": "error", "tokens": tokens}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        ids = _prompt_ids(body, tokenizer)
        return {"tokens": ids, "count": len(ids), "max_model_len": info.max_model_len}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise InvalidRequestError("tokens", "must be a list of token ids")
        text = tokenizer.decode(ids)
        return {"prompt": text, "text": text}

    @app.post("/v1/completions/render")
    async def render_completion(request: Request) -> list[dict[str, Any]]:
        body = await json_body(request)
        return [{"prompt_token_ids": _prompt_ids(body, tokenizer)}]

    @app.post("/v1/chat/completions/render")
    async def render_chat_completion(request: Request) -> list[dict[str, Any]]:
        body = await json_body(request)
        if not isinstance(body.get("messages"), list):
            raise InvalidRequestError("messages", "must be a list of {role, content}")
        return [{"prompt_token_ids": render_chat(body["messages"], tokenizer)}]

    return app


def _prompt_ids(body: dict[str, Any], tokenizer) -> list[int]:
    """Token ids of `prompt` (vLLM), `text` (sglang) or `messages` (chat); ids pass through."""
    if isinstance(body.get("messages"), list):
        return render_chat(body["messages"], tokenizer)
    prompt = body.get("prompt", body.get("text"))
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    raise InvalidRequestError("prompt", "must be a string, a list of token ids, or messages")
