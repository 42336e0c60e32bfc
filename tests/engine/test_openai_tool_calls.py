"""Tool calls end to end: a model answer with a call, in each family's syntax, goes through a
real engine core, the HTTP app on a real port and the `openai` client, and comes back as
structured `tool_calls`, streamed and not.

The engine's compute is scripted and the call markers are special tokens (tool_call_kit.py).
"""

from __future__ import annotations

import json

import openai
import pytest
from kvfleet.services.engine.api.chat_template import render_template
from kvfleet.services.engine.api.http_server import HttpServer
from kvfleet.services.engine.api.openai_http import build_app
from kvfleet.services.engine.api.openai_params import chat_messages
from kvfleet.services.engine.api.openai_schema import ChatCompletionRequest
from tool_call_kit import ANSWERS, ARGUMENTS, TEMPLATE, TOOLS, engine, tokenizer

__all__ = ["engine", "tokenizer"]  # fixtures of the kit, used by name


def serve(engine, family: str | None, answer: str):
    """An OpenAI client of a fresh app over the scripted engine, which will answer `answer`."""
    backend, compute = engine
    compute.script = backend.tokenizer.encode(answer)
    server = HttpServer(build_app(backend, tool_family=family)).start()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x",
                           max_retries=0)  # fmt: skip
    return server, client


@pytest.fixture
def served(engine, request):
    family, answer = request.param
    server, client = serve(engine, family, answer)
    with client:
        yield client
    server.stop()


def ask(client, **extra):
    messages = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
    return client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, max_tokens=200, **extra
    )


FAMILY_CASES = [(family, text) for family, (text, _content) in ANSWERS.items()]


@pytest.mark.parametrize("served", FAMILY_CASES, ids=list(ANSWERS), indirect=True)
def test_a_call_comes_back_as_tool_calls(served, request):
    """A call left in `content` ends every agent loop at its first tool."""
    family = request.node.callspec.id
    reply = ask(served).choices[0]
    assert reply.finish_reason == "tool_calls"
    assert reply.message.content == ANSWERS[family][1]
    (call,) = reply.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGUMENTS


@pytest.mark.parametrize("served", FAMILY_CASES, ids=list(ANSWERS), indirect=True)
def test_a_streamed_call_comes_back_as_tool_call_deltas(served, request):
    """Streaming agents (most of them) assemble calls from `delta.tool_calls` by index."""
    family = request.node.callspec.id
    chunks = [c for c in ask(served, stream=True) if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].index == 0 and deltas[0].id
    assert deltas[0].type == "function" and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == ARGUMENTS
    assert content == (ANSWERS[family][1] or "")
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"


@pytest.mark.parametrize("served", [("hermes", ANSWERS["hermes"][0])], indirect=True)
def test_tool_choice_none_leaves_the_text_alone(served):
    """With tool_choice "none" the client asked for text: nothing is taken out of it."""
    reply = ask(served, tool_choice="none").choices[0]
    assert reply.finish_reason == "stop" and reply.message.tool_calls is None
    assert '"name": "get_weather"' in reply.message.content


HERMES_CALL = ANSWERS["hermes"][0].removeprefix("Let me check.\n")


@pytest.mark.parametrize("served", [("hermes", HERMES_CALL)], indirect=True)
def test_required_choice_takes_the_call_its_grammar_allows(served):
    """A forced call (constrained: the scripted answer is one the grammar allows) ends the
    sample at the grammar's end and comes back as tool_calls."""
    reply = ask(served, tool_choice="required").choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content is None
    assert json.loads(reply.message.tool_calls[0].function.arguments) == ARGUMENTS


@pytest.mark.parametrize("served", [("hermes", "It is sunny in Paris.")], indirect=True)
def test_a_token_the_grammar_refuses_fails_that_request_alone(served):
    """The scripted compute ignores masks: a refused token fails the request with a 5xx that
    says so (a real model never samples one), and the engine serves the next request."""
    with pytest.raises(openai.InternalServerError, match="breaks the request's grammar"):
        ask(served, tool_choice="required")
    assert ask(served).choices[0].message.content == "It is sunny in Paris."


@pytest.mark.parametrize("served", [(None, ANSWERS["hermes"][0])], indirect=True)
def test_without_a_family_calls_stay_text(served):
    """A checkpoint whose syntax is unknown must still answer (as text), not fail."""
    reply = ask(served).choices[0]
    assert reply.finish_reason == "stop" and reply.message.tool_calls is None


@pytest.mark.parametrize("served", [("hermes", ANSWERS["hermes"][0])], indirect=True)
@pytest.mark.parametrize(
    ("tools", "tool_choice", "param"),
    [
        ([{"type": "function", "function": {"parameters": {}}}], None, "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], None,
         "tools[0].function.parameters"),
        ([{"type": "function"}], None, "tools[0].function"),
        ([{"type": "retrieval", "function": {"name": "f"}}], None, "tools[0].type"),
        (TOOLS, {"type": "function", "function": {"name": "get_time"}}, "tool_choice"),
        (TOOLS, "sometimes", "tool_choice"),
    ],
)  # fmt: skip
def test_bad_tools_are_400_naming_the_field(served, tools, tool_choice, param):
    """A 500, or a template error naming no field, leaves the client guessing what to fix."""
    extra = {"tool_choice": tool_choice} if tool_choice else {}
    with pytest.raises(openai.BadRequestError) as error:
        served.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], tools=tools, **extra
        )
    assert error.value.body["param"] == param


def test_earlier_calls_and_tool_results_reach_the_template():
    """The second turn of an agent loop resends the call and its result; a template that never
    sees them makes the model call the tool again."""
    body = ChatCompletionRequest(
        model="tiny",
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        ],
    )  # fmt: skip
    text = render_template(TEMPLATE, chat_messages(body), body.tools)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in text
    assert '"name": "get_weather"' in text.split("<tools>")[1]  # the tools themselves


@pytest.mark.parametrize("served", [("mistral", ANSWERS["mistral"][0])], indirect=True)
def test_each_streamed_sample_gets_its_own_calls(served):
    """With n > 1 the calls of one choice must not leak into another's."""
    chunks = [c for c in ask(served, stream=True, n=2) if c.choices]
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        deltas = [d for choice in mine for d in choice.delta.tool_calls or []]
        assert [d.function.name for d in deltas if d.id] == ["get_weather"]
        assert json.loads("".join(d.function.arguments for d in deltas)) == ARGUMENTS
        assert mine[-1].finish_reason == "tool_calls"
    ids = {d.id for c in chunks for d in c.choices[0].delta.tool_calls or [] if d.id}
    assert len(ids) == 2
