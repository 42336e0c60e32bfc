"""Anthropic cache breakpoints become branch hints where the marked block ends in the rendered
prompt, and the usage splits the written tokens by the breakpoints' TTLs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kvfleet.services.engine.api.anthropic_params import prepare
from kvfleet.services.engine.api.anthropic_schema import MessagesRequest
from kvfleet.services.engine.api.anthropic_shapes import usage_body
from kvfleet.services.engine.model.tokenizer import (
    ByteTokenizer,
    byte_tokenizer_json,
    load_model_tokenizer,
)
from kvfleet.services.engine.request.engine_request import InvalidRequestError, Usage
from test_branch_hints import TEMPLATE

BACKEND = SimpleNamespace(tokenizer=ByteTokenizer(), model_names=("kvfleet",))
NO_HEADERS = SimpleNamespace(headers={})
MARK = {"type": "ephemeral"}


def prepared(**body):
    request = MessagesRequest(model="kvfleet", max_tokens=4, **body)
    return prepare(request, BACKEND, NO_HEADERS)


def text_before(prepared_request, position: int) -> str:
    return BACKEND.tokenizer.decode(list(prepared_request.call.prompt_token_ids[:position]))


def test_a_system_block_breakpoint_is_a_hint_where_that_block_ends():
    """A hint inside the block, or past the next one, keeps the wrong resume point."""
    system = [
        {"type": "text", "text": "Alpha rules.", "cache_control": MARK},
        {"type": "text", "text": "Beta notes."},
    ]
    request = prepared(system=system, messages=[{"role": "user", "content": "hi"}])
    (hint,) = request.call.branch_hints
    assert text_before(request, hint).endswith("Alpha rules.\n")
    assert "Beta" not in text_before(request, hint)
    assert request.breakpoints == ((hint, 300),)


def test_message_and_automatic_breakpoints_mark_their_block_ends():
    first = {"type": "text", "text": "one", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    messages = [{"role": "user", "content": [first, {"type": "text", "text": "two"}]}]
    request = prepared(messages=messages, cache_control=MARK)
    one, end = request.call.branch_hints
    assert text_before(request, one).endswith("one\n") and "two" not in text_before(request, one)
    # Automatic caching marks the last block: the prompt up to the generation prompt.
    whole = BACKEND.tokenizer.decode(list(request.call.prompt_token_ids))
    assert whole.startswith(text_before(request, end)) and text_before(request, end).endswith(
        "two\n"
    )
    assert request.breakpoints == ((one, 3600), (end, 300))


def test_without_breakpoints_the_system_end_is_the_hint():
    """As on the OpenAI chat path: a context reset keeps the system prompt and branches there."""
    request = prepared(system="Be terse.", messages=[{"role": "user", "content": "hi"}])
    (hint,) = request.call.branch_hints
    assert text_before(request, hint).endswith("Be terse.\n") and request.breakpoints == ()


def test_the_rules_count_every_breakpoint_and_order_the_ttls():
    four = [{"type": "text", "text": f"s{i}", "cache_control": MARK} for i in range(4)]
    with pytest.raises(InvalidRequestError) as error:
        prepared(system=four, messages=[{"role": "user", "content": "hi"}], cache_control=MARK)
    assert error.value.field == "cache_control"  # the top-level one is the fifth
    long_after_tool = {
        "tools": [{"name": "t", "input_schema": {}, "cache_control": MARK}],
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral",
                                                                   "ttl": "1h"}}],
        "messages": [{"role": "user", "content": "hi"}],
    }  # fmt: skip
    with pytest.raises(InvalidRequestError) as error:
        prepared(**long_after_tool)
    assert error.value.field == "system[0].cache_control.ttl"


def test_usage_adds_up_to_the_prompt_and_splits_writes_by_ttl():
    """Written tokens before the last 1h breakpoint are 1h writes, the rest 5m ones."""
    usage = Usage(100, 16, 3, 0.0, 0.0, cache_write_tokens=64)
    body = usage_body(usage, [(48, 3600), (80, 300)])
    assert body == {
        "input_tokens": 20,
        "cache_creation_input_tokens": 64,
        "cache_read_input_tokens": 16,
        "cache_creation": {"ephemeral_5m_input_tokens": 32, "ephemeral_1h_input_tokens": 32},
        "output_tokens": 3,
    }
    assert usage_body(usage)["cache_creation"]["ephemeral_1h_input_tokens"] == 0


def test_with_a_chat_template_a_mid_message_block_ends_before_the_next_block(tmp_path):
    """A template closes a cut message (`<|im_end|>`) where the full one goes on: the hint is
    where the two renderings part, at the end of the marked block, and a tools breakpoint
    ends after the tools the template renders in the system block."""
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json(("<|im_start|>", "<|im_end|>")))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    backend = SimpleNamespace(tokenizer=load_model_tokenizer(tmp_path), model_names=("kvfleet",))
    body = MessagesRequest(
        model="kvfleet",
        max_tokens=2,
        system="Be terse.",
        tools=[{"name": "grep", "input_schema": {"type": "object"}, "cache_control": MARK}],
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "first part", "cache_control": MARK},
            {"type": "text", "text": "second part"}]}],
    )  # fmt: skip
    request = prepare(body, backend, NO_HEADERS)
    tools_end, block_end = request.call.branch_hints
    prompt = list(request.call.prompt_token_ids)
    im_end = prompt[tools_end - 2]  # the system block ends "<|im_end|>\n"
    assert backend.tokenizer.decode(prompt[:tools_end]).endswith('"object"}}}\n')
    assert prompt.index(im_end) == tools_end - 2  # the first <|im_end|>: the system block's
    assert backend.tokenizer.decode(prompt[:block_end]).endswith("user\nfirst part")
    assert backend.tokenizer.decode(prompt[block_end:]).startswith("\nsecond part")
