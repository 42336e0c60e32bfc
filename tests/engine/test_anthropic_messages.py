"""The Anthropic Messages API answers the real `anthropic` SDK, on an engine's own HTTP port and
on the fleet's router front (two ranks): multi-turn reuse with exact usage counts, streamed and
not, stop sequences, count_tokens, and bad input as Anthropic-shaped 4xx naming the field.

Usage is exact because the tiny model's byte tokenizer makes every count computable: with
pages of 16, a turn writes the prompt's whole blocks past what it reused, and a one-token
turn 1 leaves exactly its prompt's whole blocks for turn 2 to read.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from engine_testkit import TEST_CONFIG
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig

CONFIG = TEST_CONFIG.with_changes(reuse_policy="per_conversation")
BLOCK = CONFIG.page_size
GREEDY = {"temperature": 0}  # the SDK no longer takes sampling arguments: the body does


@pytest.fixture(scope="module")
def rank():
    rank = EngineRank(CONFIG, RankAddresses(http_port=0, rank_id="messages-rank")).start()
    yield f"http://127.0.0.1:{rank.http_port}"
    rank.core.check_integrity()
    rank.stop(grace=0.5)


@pytest.fixture(scope="module")
def fleet():
    fleet = EmbeddedFleet(FleetConfig(CONFIG, num_ranks=2)).start()
    yield fleet.http_base_url.removesuffix("/v1")
    fleet.stop()


@pytest.fixture(params=["rank", "fleet"])
def base(request) -> str:
    return request.getfixturevalue(request.param)


def client_for(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="any", max_retries=0)


def whole_blocks(tokens: int) -> int:
    return tokens // BLOCK * BLOCK


def expect_usage(usage, prompt: int, read: int) -> None:
    written = whole_blocks(prompt) - read
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (read, written)
    assert usage.input_tokens == prompt - read - written


@pytest.mark.parametrize("stream", [False, True])
def test_the_second_turn_reads_what_the_first_wrote(base, stream):
    """Without reuse every agent turn would recompute the whole conversation; without exact
    counts a client cannot tell."""
    client = client_for(base)
    system = f"You are a terse coding agent (stream={stream}). " * 2
    first_turn = [{"role": "user", "content": "Fix the parser bug in tokenizer.py, please."}]
    one = {"model": "kvfleet", "system": system, "extra_body": GREEDY}
    prompt_1 = client.messages.count_tokens(**one, messages=first_turn).input_tokens
    first = client.messages.create(**one, messages=first_turn, max_tokens=1)
    assert first.usage.output_tokens == 1 and first.stop_reason == "max_tokens"
    expect_usage(first.usage, prompt_1, read=0)
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": [{"type": "text", "text": first.content[0].text}]},
        {"role": "user", "content": [{"type": "text", "text": "Now add a regression test."}]},
    ]
    prompt_2 = client.messages.count_tokens(**one, messages=second_turn).input_tokens
    if stream:
        with client.messages.stream(**one, messages=second_turn, max_tokens=6) as events:
            kinds = [e.type for e in events if e.type != "text"]
            second = events.get_final_message()
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        assert kinds[1:3] == ["content_block_start", "content_block_delta"]
        assert kinds[-3] == "content_block_stop"
    else:
        second = client.messages.create(**one, messages=second_turn, max_tokens=6)
    assert second.usage.output_tokens == 6 and second.stop_reason == "max_tokens"
    expect_usage(second.usage, prompt_2, read=whole_blocks(prompt_1))
    assert second.usage.cache_read_input_tokens > 0


def test_a_stop_sequence_ends_the_text_before_it_and_is_named(rank):
    """A stop sequence that ran on, or was not reported, breaks harnesses that stop on it."""
    client = client_for(rank)
    body = {
        "model": "kvfleet",
        "messages": [{"role": "user", "content": "Count from one to twenty."}],
        "extra_body": GREEDY,
    }
    plain = client.messages.create(**body, max_tokens=24).content[0].text
    stop = next(plain[i : i + 2] for i in range(2, len(plain) - 1) if plain[i : i + 2].strip())
    expected = plain[: plain.find(stop)]
    answer = client.messages.create(**body, max_tokens=24, stop_sequences=[stop, "\x00never"])
    assert (answer.stop_reason, answer.stop_sequence) == ("stop_sequence", stop)
    assert answer.content[0].text == expected
    with client.messages.stream(**body, max_tokens=24, stop_sequences=[stop]) as events:
        streamed = "".join(events.text_stream)
        final = events.get_final_message()
    assert streamed == expected and final.stop_sequence == stop
    assert final.stop_reason == "stop_sequence"


def test_count_tokens_is_the_prompt_the_message_call_reports(rank):
    client = client_for(rank)
    tools = [{"name": "read_file", "description": "Read a file.", "input_schema": {
        "type": "object", "properties": {"path": {"type": "string"}}}}]  # fmt: skip
    body = {
        "model": "kvfleet",
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "tools": tools,
        "messages": [
            {"role": "user", "content": "Show me main.py"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "read_file",
                 "input": {"path": "main.py"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "print('hi')"}]},
        ],
    }  # fmt: skip
    counted = client.messages.count_tokens(**body).input_tokens
    usage = client.messages.create(**body, max_tokens=2, extra_body=GREEDY).usage
    total = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert total == counted > 0


def ephemeral(ttl: str = "5m") -> dict:
    return {"type": "ephemeral", "ttl": ttl}


def marked(text: str, ttl: str = "5m") -> dict:
    return {"type": "text", "text": text, "cache_control": ephemeral(ttl)}


HI = [{"role": "user", "content": "hi"}]
TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}


@pytest.mark.parametrize(
    ("body", "status", "names"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
         400, "messages[0].content[0].type"),
        ({"system": [marked(f"s{i}") for i in range(5)], "messages": HI},
         400, "system[4].cache_control"),
        ({"system": [marked("short"), marked("long", "1h")], "messages": HI},
         400, "system[1].cache_control.ttl"),
        ({"messages": [*HI, {"role": "assistant", "content": "ok"}, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_none", "content": "x"}]}]},
         400, "messages[2].content[0].tool_use_id"),
        ({"messages": HI, "model": "claude-none"}, 404, "model"),
        ({"messages": HI, "tool_choice": {"type": "any"}}, 400, "tool_choice.type"),
        ({"messages": HI, "tools": [TOOL], "tool_choice": {"type": "tool", "name": "g"}},
         400, "tool_choice.name"),
        ({"messages": HI, "tools": [{**TOOL, "input_schema": {"type": "nosuch"}}],
          "tool_choice": {"type": "any"}}, 400, "tools[0].input_schema"),
        ({"messages": HI, "tools": [{**TOOL, "strict": True, "input_schema": {"$ref": "#/x"}}]},
         400, "tools[0].input_schema"),
        # The tiny model's byte tokenizer teaches no call syntax: a call cannot be forced.
        ({"messages": HI, "tools": [TOOL], "tool_choice": {"type": "any"}}, 400, "tool_choice"),
        ({"messages": HI, "output_config": {"format": {"type": "json_schema",
                                                       "schema": {"type": "nosuch"}}}},
         400, "output_config.format.schema"),
    ],
)  # fmt: skip
def test_bad_input_is_an_anthropic_error_naming_the_field(rank, body, status, names):
    """A 5xx or an OpenAI-shaped body for bad input leaves an Anthropic client guessing."""
    client = client_for(rank)
    with pytest.raises(anthropic.APIStatusError) as error:
        client.messages.create(**{"model": "kvfleet", "max_tokens": 2, **body})
    assert error.value.status_code == status
    shape = error.value.body
    assert shape["type"] == "error" and shape["error"]["message"].startswith(f"{names}: ")
    kind = {400: "invalid_request_error", 404: "not_found_error"}[status]
    assert shape["error"]["type"] == kind


def test_output_format_is_held_on_both_fronts(base):
    """output_config.format reaches the rank's sampler through the router front too (the
    grammar travels in the sampling params): the random model's answer is the JSON asked for."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    message = client_for(base).messages.create(
        model="kvfleet", max_tokens=40, messages=HI,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )  # fmt: skip
    assert message.stop_reason == "end_turn"
    assert json.loads(message.content[0].text) in ({"ok": True}, {"ok": False})


def test_missing_max_tokens_and_an_oversized_body_are_anthropic_errors(rank):
    """The SDK never sends these; other clients do, and must read Anthropic's shape."""
    body = {"model": "kvfleet", "messages": HI}
    missing = httpx.post(f"{rank}/v1/messages", json=body, timeout=30)
    assert missing.status_code == 400
    assert missing.json()["error"]["message"].startswith("max_tokens: ")
    huge = httpx.post(
        f"{rank}/v1/messages", content=b"{" + b" " * (17 * 2**20) + b"}", timeout=60,
        headers={"content-type": "application/json"},
    )  # fmt: skip
    assert huge.status_code == 413
    assert huge.json() == {"type": "error", "error": huge.json()["error"]}
    assert huge.json()["error"]["type"] == "request_too_large"
    openai_route = httpx.post(f"{rank}/v1/chat/completions", json={"model": "x"}, timeout=30)
    assert "param" in openai_route.json()["error"]  # the OpenAI routes keep their shape
