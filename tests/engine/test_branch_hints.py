"""Branch hints: a turn that names where its system prompt ends keeps a resume point there, so
a context reset (same system prompt, the rest rewritten) resumes on a hybrid model, with the
same greedy output as an empty cache; the OpenAI chat path finds the hint from the template,
and a hint outside the prompt is refused by name over HTTP and gRPC."""

from __future__ import annotations

import json
from types import SimpleNamespace

import grpc
import httpx
import pytest
import torch
from engine_testkit import final, greedy, run_call, shared_compute, tokens_of
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.engine.api.openai_params import chat_prompt, system_end_hint
from kvfleet.services.engine.api.openai_schema import ChatCompletionRequest
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.model.tokenizer import byte_tokenizer_json, load_model_tokenizer
from kvfleet.services.engine.request.engine_request import GenerateCall
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig

PAGE = 16
SYSTEM = [(7 * i) % 251 for i in range(64)]  # four pages: the tools and system prompt
# A hybrid model (SSM state + attention) resumes only where a state snapshot is kept.
CONFIG = EngineConfig(
    model="hybrid-tiny",
    max_batch_size=2,
    max_num_batched_tokens=64,
    page_size=PAGE,
    kv_pages=160,
    checkpoint_margin_tokens=32,
    state_offsets_from_end=(0, 32),
    reuse_policy="per_conversation",
    keep_branch_points=1,
)


def _call(request_id: str, prompt: list[int], hints: tuple[int, ...] = ()) -> GenerateCall:
    return GenerateCall(request_id, tuple(prompt), greedy(4, logprobs=0), "c", branch_hints=hints)


@pytest.mark.parametrize(("hints", "reused"), [((64,), 64), ((70,), 64), ((), 0)])
def test_the_first_reset_resumes_at_the_hinted_system_end(hints, reused):
    """Without the hint no state snapshot ends at the system prompt: the reset recomputes it."""
    core = EngineCore(CONFIG, compute=shared_compute(CONFIG, "hints")).start()
    try:
        run_call(core, _call("t1", SYSTEM + list(range(100, 180)), hints))
        reset = run_call(core, _call("t2", SYSTEM + list(range(200, 260))))
        core.check_integrity()
    finally:
        core.stop()
    assert final(reset).usage.cached_tokens == reused
    fresh_core = EngineCore(CONFIG, compute=shared_compute(CONFIG, "hints-fresh")).start()
    try:
        fresh = run_call(fresh_core, _call("f", SYSTEM + list(range(200, 260))))
    finally:
        fresh_core.stop()
    assert tokens_of(reset) == tokens_of(fresh)
    torch.testing.assert_close(
        [e.logprob for o in reset for e in o.logprobs],
        [e.logprob for o in fresh for e in o.logprobs],
        rtol=0,
        atol=1e-4,
    )


# Tools rendered inside the system block, as Qwen's template does.
TEMPLATE = (
    "{%- if tools or messages[0].role == 'system' %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{%- for tool in tools or [] %}\n{{ tool | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages if m.role != 'system' %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]


@pytest.fixture
def backend(tmp_path):
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json(("<|im_start|>", "<|im_end|>")))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return SimpleNamespace(tokenizer=load_model_tokenizer(tmp_path))


@pytest.mark.parametrize("role", ["system", "developer"])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_the_chat_hint_is_where_the_system_block_ends_in_the_prompt(backend, tools, role):
    """A hint past the system block would pin a window of the user's text; one short of it
    would make every reset recompute the system prompt's tail."""
    system = "You are a coding agent."
    body = ChatCompletionRequest(
        model="m",
        messages=[{"role": role, "content": system}, {"role": "user", "content": "hi"}],
        tools=tools,
    )
    prompt = chat_prompt(body, backend)
    im_start, im_end = 256, 257  # the byte tokenizer's first special tokens
    assert prompt[0] == im_start and prompt.count(im_end) == 2
    assert system_end_hint(body, backend, prompt) == (prompt.index(im_end) + 2,)  # and "\n"
    assert bytes(prompt[prompt.index(im_end) + 3 :][:7]) == b"user\nhi"


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "no system prompt"}],
        [{"role": "system", "content": "only a system prompt"}],
    ],
)
def test_no_chat_hint_without_a_system_prompt_and_a_turn_after_it(backend, messages):
    body = ChatCompletionRequest(model="m", messages=messages)
    assert system_end_hint(body, backend, chat_prompt(body, backend)) == ()


@pytest.fixture(scope="module")
def fleet():
    fleet = EmbeddedFleet(FleetConfig(CONFIG, num_ranks=1, redis_url=None)).start()
    yield fleet
    fleet.stop()


def test_a_chat_reset_resumes_through_router_and_front(fleet):
    """The derived hint must survive the HTTP front, the router's request and the engine's."""

    def cached(system: str, user: str, **extra) -> int:
        body = {
            "model": "kvfleet",
            "messages": [
                {"role": "system", "content": system * 6},
                {"role": "user", "content": user},
            ],
            "max_tokens": 2,
            "temperature": 0,
            **extra,
        }
        headers = {"X-Conversation-Id": system.split()[-2]}  # careful, hasty
        answer = httpx.post(f"{fleet.http_base_url}/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    first, reset = "the first question, long enough " * 3, "a context reset: a summary " * 3
    assert cached("You are a careful agent. ", first) == 0
    assert cached("You are a careful agent. ", reset) >= 128
    # An explicit empty list turns the derived hint off: the reset then recomputes everything.
    assert cached("Be a hasty agent. ", first, branch_hints=[]) == 0
    assert cached("Be a hasty agent. ", reset, branch_hints=[]) == 0


@pytest.mark.parametrize("hints", [[0], [10_000], list(range(1, 11))])
def test_a_hint_outside_the_prompt_is_a_400_naming_the_field(fleet, hints):
    body = {"model": "kvfleet", "prompt": list(range(40)), "max_tokens": 1, "branch_hints": hints}
    answer = httpx.post(f"{fleet.http_base_url}/completions", json=body)
    assert answer.status_code in (400, 422), answer.text
    assert "branch_hints" in answer.text


def test_a_hint_outside_the_prompt_is_invalid_argument_over_grpc(fleet):
    with grpc.insecure_channel(fleet.router_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        request = router_pb2.GenerateRequest(
            prompt_token_ids=common_pb2.TokenIds(ids=list(range(40))),
            max_tokens=1,
            branch_hints=[41],
        )
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(request, timeout=30))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "branch_hints" in error.value.details()
