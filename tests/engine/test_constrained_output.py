"""Constrained output end to end: a tiny random model (the tiny preset, random weights, CPU)
behind a real engine core, the HTTP app on a real port and the real `openai` and `anthropic`
SDKs. Sampled at temperature 1, its text is noise; under a forced `tool_choice` or a JSON
`response_format` it is a call (or JSON) valid against the schema, in the family's syntax,
and comes back as `tool_calls` / `tool_use`. The same requests without the constraint do not
validate, so a skipped mask fails these tests.

The tokenizer is the tool kit's byte tokenizer, whose call markers are special tokens.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
from engine_testkit import shared_compute
from kvfleet.services.engine.api.http_backends import EngineBackend
from kvfleet.services.engine.api.http_server import HttpServer
from kvfleet.services.engine.api.openai_http import build_app
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from tool_call_kit import write_tool_tokenizer

pytestmark = pytest.mark.slow  # a few hundred CPU decode steps of the tiny model

# Bounded values (an enum, a one-digit integer, a boolean): a random model's choices end fast.
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "metric": {"type": "boolean"},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME_PARAMETERS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMETERS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 6},
        "score": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "score"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
CONFIG = EngineConfig(model="tiny", max_batch_size=4, max_num_batched_tokens=256, page_size=16,
                      kv_pages=256)  # fmt: skip
RANDOM = {"temperature": 1.0, "max_tokens": 160}
FAMILIES = ("hermes", "llama3_json", "mistral", "qwen3_coder")


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    core = EngineCore(CONFIG, compute=shared_compute(CONFIG, "constrained")).start()
    yield EngineBackend(core, write_tool_tokenizer(tmp_path_factory), ("tiny",))
    core.stop()


@pytest.fixture(scope="module", params=["hermes"])
def clients(backend, request):
    """(openai client, anthropic client) of one app whose model writes calls in the family
    `request.param`."""
    server = HttpServer(build_app(backend, tool_family=request.param)).start()
    base = f"http://127.0.0.1:{server.port}"
    with (
        openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as chat,
        anthropic.Anthropic(base_url=base, api_key="x", max_retries=0) as messages,
    ):
        yield chat, messages
    server.stop()


def chat(client, seed: int, **extra):
    """A chat request of the random model at temperature 1 (with TOOLS unless `tools` says)."""
    extra.setdefault("tools", TOOLS)
    return client.chat.completions.create(
        model="tiny", messages=MESSAGES, seed=seed, **{**RANDOM, **extra}
    )


def assert_valid_calls(calls) -> None:
    assert calls, "no call came back"
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("clients", FAMILIES, indirect=True)
@pytest.mark.parametrize("seed", [1, 2])
def test_named_tool_choice_forces_a_valid_call_in_each_family(clients, seed):
    """A named function comes back as that function's call whatever the model wanted to say."""
    choice = {"type": "function", "function": {"name": "get_time"}}
    reply = chat(clients[0], seed, tool_choice=choice).choices[0]
    assert reply.finish_reason == "tool_calls"
    assert [call.function.name for call in reply.message.tool_calls] == ["get_time"]
    assert_valid_calls(reply.message.tool_calls)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_required_forces_valid_calls(clients, seed):
    """tool_choice "required": one call or more, each valid against its tool's schema."""
    reply = chat(clients[0], seed, tool_choice="required", parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    assert_valid_calls(choice.message.tool_calls)


def test_a_streamed_forced_call_comes_back_as_deltas(clients):
    """Streaming agents assemble the call from `delta.tool_calls`."""
    chunks = list(chat(clients[0], 6, tool_choice="required", stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    names = [d.function.name for d in deltas if d.id]
    arguments: dict[int, str] = {}
    for delta in deltas:
        arguments[delta.index] = arguments.get(delta.index, "") + (delta.function.arguments or "")
    assert len(names) == len(arguments) >= 1
    for name, text in zip(names, arguments.values(), strict=True):
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_without_the_constraint_the_random_model_writes_no_call(clients):
    """The proof that the calls above come from the mask: the same model unconstrained."""
    for seed in (1, 2, 3):
        reply = chat(clients[0], seed, tool_choice="auto").choices[0]
        assert reply.message.tool_calls is None and reply.finish_reason != "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_response_format_validates(clients, stream):
    """response_format json_schema: the whole answer is JSON valid against the schema."""
    schema = {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}
    response_format = {"type": "json_schema", "json_schema": schema}
    reply = chat(clients[0], 7, tools=None, response_format=response_format, stream=stream)
    if stream:
        chunks = [c for c in reply if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        text, reason = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert reason == "stop"
    jsonschema.validate(json.loads(text), ANSWER_SCHEMA)


def test_json_object_response_format_is_an_object(clients):
    reply = chat(clients[0], 8, tools=None, response_format={"type": "json_object"},
                 max_tokens=400)  # fmt: skip
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_without_response_format_the_random_model_writes_no_valid_json(clients):
    for seed in (7, 8):
        text = chat(clients[0], seed, tools=None).choices[0].message.content
        with pytest.raises((ValueError, jsonschema.ValidationError)):
            jsonschema.validate(json.loads(text), ANSWER_SCHEMA)


def test_a_strict_tool_holds_a_started_call_to_its_schema(clients):
    """strict under tool_choice auto: text is free, but a call the model starts is valid."""
    tools = [{"type": "function", "function": {**t["function"], "strict": True}} for t in TOOLS]
    calls = []
    for seed in range(10, 16):
        calls += chat(clients[0], seed, tools=tools).choices[0].message.tool_calls or []
    assert_valid_calls(calls)  # seeded: the model starts a call in one of these answers


ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "tool_choice",
    [{"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "get_time"}],
    ids=["any", "tool"],
)
def test_anthropic_forced_tool_use_is_valid(clients, tool_choice, stream):
    """Messages API: `any` / `tool` come back as valid tool_use blocks, stop_reason tool_use."""
    request = {"model": "tiny", "max_tokens": 160, "messages": MESSAGES,  # temperature 1
               "tools": ANTHROPIC_TOOLS, "tool_choice": tool_choice}  # fmt: skip
    if stream:
        with clients[1].messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = clients[1].messages.create(**request)
    assert message.stop_reason == "tool_use"
    uses = [block for block in message.content if block.type == "tool_use"]
    assert len(uses) == 1
    if tool_choice["type"] == "tool":
        assert uses[0].name == "get_time"
    jsonschema.validate(uses[0].input, SCHEMAS[uses[0].name])


def test_anthropic_output_format_validates(clients):
    message = clients[1].messages.create(
        model="tiny", max_tokens=160, messages=MESSAGES,
        output_config={"format": {"type": "json_schema", "schema": ANSWER_SCHEMA}},
    )  # fmt: skip
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), ANSWER_SCHEMA)


def test_the_grammar_end_ends_the_answer_without_eos_stops(clients):
    """ignore_eos drops the stop ids: the grammar's own end must still end the sample."""
    schema = {"name": "answer", "schema": ANSWER_SCHEMA}
    reply = chat(clients[0], 9, tools=None, max_tokens=400, extra_body={"ignore_eos": True},
                 response_format={"type": "json_schema", "json_schema": schema})  # fmt: skip
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), ANSWER_SCHEMA)
