"""Tool calls on the Messages API end to end: a model answer with a call goes through a real
engine core, the HTTP app on a real port and the `anthropic` SDK, and comes back as a
`tool_use` block with stop_reason `tool_use`, streamed (content_block_start, input_json_delta,
content_block_stop) and not; the SDK then sends the call back with its `tool_result` and the
second turn reads the first turn's prefix from the cache.

The engine's compute is scripted and the call markers are special tokens (tool_call_kit.py).
"""

from __future__ import annotations

import anthropic
import pytest
from kvfleet.services.engine.api.http_server import HttpServer
from kvfleet.services.engine.api.openai_http import build_app
from tool_call_kit import ANSWERS, ARGUMENTS, TOOLS, engine, tokenizer

__all__ = ["engine", "tokenizer"]  # fixtures of the kit, used by name

# The kit's tool in Anthropic's shape.
ANTHROPIC_TOOLS = [
    {
        "name": tool["function"]["name"],
        "description": tool["function"]["description"],
        "input_schema": tool["function"]["parameters"],
    }
    for tool in TOOLS
]
QUESTION = {"role": "user", "content": "Weather in Paris for 3 days?"}
FAMILIES = ("hermes", "mistral")


@pytest.fixture
def served(engine, request):
    """An Anthropic client of a fresh app over the scripted engine, which will answer the
    text `request.param[1]` in family `request.param[0]`'s syntax."""
    family, answer = request.param
    backend, compute = engine
    compute.script = backend.tokenizer.encode(answer)
    server = HttpServer(build_app(backend, tool_family=family)).start()
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="x",
                                 max_retries=0)  # fmt: skip
    with client:
        yield client
    server.stop()


def ask(client, messages=(QUESTION,), **extra):
    return client.messages.create(
        model="tiny", max_tokens=200, messages=list(messages), tools=ANTHROPIC_TOOLS, **extra
    )


def ask_streamed(client, **extra):
    """The stream's events, and the message the SDK assembles from them."""
    with client.messages.stream(
        model="tiny", max_tokens=200, messages=[QUESTION], tools=ANTHROPIC_TOOLS, **extra
    ) as stream:
        events = list(stream)
        return events, stream.get_final_message()


FAMILY_CASES = [(family, ANSWERS[family][0]) for family in FAMILIES]


@pytest.mark.parametrize("served", FAMILY_CASES, ids=FAMILIES, indirect=True)
def test_a_call_comes_back_as_a_tool_use_block(served, request):
    """A call left in a text block ends every Claude Code loop at its first tool."""
    family = request.node.callspec.id
    reply = ask(served)
    assert reply.stop_reason == "tool_use"
    texts = [block.text for block in reply.content if block.type == "text"]
    assert texts == ([ANSWERS[family][1]] if ANSWERS[family][1] else [])
    (call,) = [block for block in reply.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.input == ARGUMENTS
    assert call.id.startswith("toolu_") if family != "mistral" else len(call.id) == 9
    assert reply.content[-1] is call  # text before the call stays before it


@pytest.mark.parametrize("served", FAMILY_CASES, ids=FAMILIES, indirect=True)
def test_a_streamed_call_comes_back_as_tool_use_events(served, request):
    """Claude Code streams: it builds a call from content_block_start (type tool_use, empty
    input), input_json_delta pieces and content_block_stop, by block index."""
    family = request.node.callspec.id
    events, message = ask_streamed(served)
    starts = [e for e in events if e.type == "content_block_start"]
    tool_start = next(e for e in starts if e.content_block.type == "tool_use")
    assert tool_start.content_block.name == "get_weather"
    assert tool_start.content_block.input == {}
    deltas = [e for e in events if e.type == "content_block_delta" and e.index == tool_start.index]
    assert deltas and all(e.delta.type == "input_json_delta" for e in deltas)
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert stops == [s.index for s in starts]  # every block opened is closed, in order
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.input == ARGUMENTS and call.id == tool_start.content_block.id
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text == (ANSWERS[family][1] or "")


@pytest.mark.parametrize("served", [("hermes", ANSWERS["hermes"][0])], indirect=True)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_choice_none_leaves_the_text_alone(served, stream):
    """With tool_choice none the client asked for text: nothing is taken out of it."""
    extra = {"tool_choice": {"type": "none"}}
    reply = ask_streamed(served, **extra)[1] if stream else ask(served, **extra)
    assert reply.stop_reason == "end_turn"
    assert [block.type for block in reply.content] == ["text"]
    assert '"name": "get_weather"' in reply.content[0].text


# A call cut off inside its arguments: there is no JSON object to hand the client.
MALFORMED = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city":\n</tool_call>'
)


@pytest.mark.parametrize("served", [("hermes", MALFORMED)], indirect=True)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_malformed_call_stays_text(served, stream):
    """A call the parser cannot read must reach the client as the model wrote it, not vanish
    and not become a call with invented arguments."""
    reply = ask_streamed(served)[1] if stream else ask(served)
    assert reply.stop_reason == "end_turn"
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == MALFORMED


@pytest.mark.parametrize("served", [(None, ANSWERS["hermes"][0])], indirect=True)
def test_without_a_family_calls_stay_text(served):
    """A checkpoint whose syntax is unknown must still answer (as text), not fail."""
    reply = ask(served)
    assert reply.stop_reason == "end_turn" and [b.type for b in reply.content] == ["text"]


@pytest.mark.parametrize("served", FAMILY_CASES, ids=FAMILIES, indirect=True)
def test_an_agent_loop_sends_the_call_back_and_reads_its_prefix_from_the_cache(served):
    """The second turn resends the tool_use with its tool_result: it must render (the
    template sees the call and the result) and reuse the first turn's prompt, or every tool
    round trip recomputes the whole context."""
    first = ask(served)
    (call,) = [block for block in first.content if block.type == "tool_use"]
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"}
    history = [
        QUESTION,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": [result]},
    ]
    second = ask(served, messages=history)
    assert second.usage.cache_read_input_tokens > 0
    assert (
        second.usage.input_tokens
        + second.usage.cache_read_input_tokens
        + (second.usage.cache_creation_input_tokens or 0)
        > first.usage.input_tokens + first.usage.cache_creation_input_tokens
    )
