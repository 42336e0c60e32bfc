"""Tool calls parsed from model text, whole and streamed, for every family.

The texts are written the way each model family emits them (after decoding, markers kept).
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.services.engine.api.tool_calls import (
    ContentDelta,
    ToolCallDelta,
    ToolCallStream,
    family_for_checkpoint,
    parse_tool_calls,
    resolve_tool_family,
)

WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "limit": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "follow": {"type": "boolean"},
                    "lines": {"type": "array"},
                    "code": {"type": "string"},
                },
            },
        },
    }
]

# (family, text, expected content, expected [(name, arguments as a dict)])
CASES = [
    # Llama 3.1/3.2/3.3 with custom tools: bare JSON, "parameters", eot already stripped.
    (
        "llama3_json",
        '{"name": "get_current_weather", "parameters": {"location": "San Francisco, CA", '
        '"unit": "fahrenheit"}}',
        "",
        [("get_current_weather", {"location": "San Francisco, CA", "unit": "fahrenheit"})],
    ),
    (
        "llama3_json",
        '\n\n{"name": "search", "parameters": {"q": "kv cache"}}; '
        '{"name": "open", "parameters": {"url": "https://x.org/a;b"}}',
        "",
        [("search", {"q": "kv cache"}), ("open", {"url": "https://x.org/a;b"})],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "brave_search", "parameters": {"query": "llama 3 release"}}',
        "",
        [("brave_search", {"query": "llama 3 release"})],
    ),
    (
        "llama3_json",
        'Let me look that up.<|python_tag|>{"name": "wolfram_alpha", '
        '"arguments": {"query": "2+2"}}',
        "Let me look that up.",
        [("wolfram_alpha", {"query": "2+2"})],
    ),
    ("llama3_json", 'Here is JSON: {"name": "x"}', 'Here is JSON: {"name": "x"}', []),
    ("llama3_json", '{"answer": 42, "unit": "m"}', '{"answer": 42, "unit": "m"}', []),
    # Mistral 7B v0.3 / Mixtral 8x22B: a JSON list after [TOOL_CALLS].
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": "Paris, France",'
        ' "format": "celsius"}}, {"name": "get_time", "arguments": {"tz": "CET"}}]',
        "",
        [
            ("get_current_weather", {"location": "Paris, France", "format": "celsius"}),
            ("get_time", {"tz": "CET"}),
        ],
    ),
    # Mistral Small 3.2 / Magistral / Devstral: name[ARGS]{...}, each call its own marker.
    (
        "mistral",
        'Checking both.[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}',
        "Checking both.",
        [("get_weather", {"city": "Lyon"}), ("get_weather", {"city": "Nice"})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]search[CALL_ID]a1B2c3D4e[ARGS]{"q": "[ARGS] in text"}',
        "",
        [("search", {"q": "[ARGS] in text"})],
    ),
    ("mistral", "Use a list like [1, 2] here.", "Use a list like [1, 2] here.", []),
    # Qwen2.5 / Qwen3 (hermes): one <tool_call> block per call, newline-separated.
    (
        "hermes",
        '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
        '"San Francisco, CA, USA"}}\n</tool_call>\n<tool_call>\n{"name": "get_temperature_date",'
        ' "arguments": {"location": "San Francisco, CA, USA", "date": "2024-10-01"}}\n</tool_call>',
        "",
        [
            ("get_current_temperature", {"location": "San Francisco, CA, USA"}),
            ("get_temperature_date", {"location": "San Francisco, CA, USA", "date": "2024-10-01"}),
        ],
    ),
    (
        "hermes",
        "<think>\nThe user wants the weather; call the tool.\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<think>\nThe user wants the weather; call the tool.\n</think>",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "hermes",
        'I will run it.\n<tool_call>\n{"name": "run", "arguments": "{\\"cmd\\": \\"ls\\"}"}\n'
        "</tool_call>\nDone.",
        "I will run it.\n\nDone.",
        [("run", {"cmd": "ls"})],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>\n\nListing the folder.',
        "Listing the folder.",
        [("ls", {})],
    ),
    # Qwen3-Coder: XML-ish, values converted by the tool's schema.
    (
        "qwen3_coder",
        "I'll read the file first.\n<tool_call>\n<function=read_file>\n<parameter=path>\n"
        "src/main.py\n</parameter>\n<parameter=limit>\n50\n</parameter>\n<parameter=ratio>\n"
        "0.5\n</parameter>\n<parameter=follow>\nTrue\n</parameter>\n<parameter=lines>\n[1, 2]\n"
        "</parameter>\n<parameter=code>\ndef f():\n    return {'a': 1}\n</parameter>\n"
        "</function>\n</tool_call>",
        "I'll read the file first.",
        [
            (
                "read_file",
                {
                    "path": "src/main.py",
                    "limit": 50,
                    "ratio": 0.5,
                    "follow": True,
                    "lines": [1, 2],
                    "code": "def f():\n    return {'a': 1}",
                },
            )
        ],
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=unknown_tool>\n<parameter=n>\n7\n</parameter>\n</function>\n"
        "</tool_call>",
        "",
        [("unknown_tool", {"n": "7"})],  # no schema: values stay text
    ),
    (
        "qwen3_coder",  # the <tool_call> opener left out, as Qwen3-Coder does at times
        "Reading it.\n<function=read_file>\n<parameter=path>\na.py\n</parameter>\n</function>\n"
        "</tool_call>\n<function=read_file>\n<parameter=limit>\n5\n</parameter>\n</function>",
        "Reading it.",
        [("read_file", {"path": "a.py"}), ("read_file", {"limit": 5})],
    ),
]

MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f", "argu'),  # cut by max_tokens
    ("hermes", '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>'),  # no name
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n"),
    ("qwen3_coder", "<tool_call>\n<function=f>\nstray\n</function>\n</tool_call>"),
    ("qwen3_coder", "Use <function=name> tags in the template."),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}'),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": '),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": [1]}]'),
    ("llama3_json", '{"name": "f", "parameters": {"a": 1}'),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": "not json"}'),
]


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(("family", "text", "content", "calls"), CASES)
def test_whole_text_gives_content_and_calls(family, text, content, calls):
    """A call left in the text stops the agent loop; a call invented breaks the answer."""
    got_content, got_calls = parse_tool_calls(text, family, tools=WEATHER_TOOLS)
    assert got_content == content
    assert calls_of(got_calls) == calls
    if family == "mistral":  # Mistral's templates refuse any other id in the history
        assert all(len(c.id) == 9 and c.id.isalnum() for c in got_calls)
    else:
        assert all(c.id.startswith("call_") and len(c.id) > 10 for c in got_calls)
    assert len({c.id for c in got_calls}) == len(got_calls)


@pytest.mark.parametrize(("family", "text"), MALFORMED)
def test_malformed_or_cut_calls_stay_text(family, text):
    """A malformed call must reach the client as the model wrote it, not vanish or raise."""
    assert parse_tool_calls(text, family, tools=WEATHER_TOOLS) == (text, [])


def replay(family: str, pieces: list[str]) -> tuple[str, list[tuple[str, dict]], list]:
    """Feed `pieces`, then put the deltas back together as a streaming client does."""
    stream = ToolCallStream(family, tools=WEATHER_TOOLS)
    events = [e for piece in pieces for e in stream.feed(piece)] + stream.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls: dict[int, list] = {}
    for event in events:
        if isinstance(event, ToolCallDelta):
            if event.id is not None:
                assert event.index not in calls and event.name and event.id
                calls[event.index] = [event.name, ""]
            calls[event.index][1] += event.arguments
    assert list(calls) == list(range(len(calls)))
    assert all(e.text for e in events if isinstance(e, ContentDelta))
    return content, [(name, json.loads(args)) for name, args in calls.values()], events


ALL_TEXTS = [(c[0], c[1]) for c in CASES] + MALFORMED


@settings(max_examples=25, deadline=None)
@given(case=st.sampled_from(ALL_TEXTS), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_any_split_streams_what_the_whole_text_gives(case, cuts):
    """A stream that splits a marker or a JSON body differently from the whole text would show
    a streaming client other calls than a non-streaming one."""
    family, text = case
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in itertools.pairwise(points)]
    content, calls = parse_tool_calls(text, family, tools=WEATHER_TOOLS)
    streamed, streamed_calls, _ = replay(family, pieces)
    assert (streamed, streamed_calls) == (content, calls_of(calls))


@pytest.mark.parametrize(("family", "text"), ALL_TEXTS)
def test_one_character_at_a_time(family, text):
    """The worst split: every marker and every JSON token arrives in pieces."""
    content, calls = parse_tool_calls(text, family, tools=WEATHER_TOOLS)
    assert replay(family, list(text))[:2] == (content, calls_of(calls))


def test_text_that_may_start_a_call_is_held_back_and_plain_text_is_not():
    """Content must flow while the model writes prose, but never show half a marker."""
    stream = ToolCallStream("hermes")
    assert stream.feed("Sure, one moment <tool_") == [ContentDelta("Sure, one moment")]
    events = stream.feed('call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    assert [type(e) for e in events] == [ToolCallDelta, ToolCallDelta]
    assert events[0].name == "f" and events[1] == ToolCallDelta(0, None, None, "{}")
    assert stream.feed("\nAfter.") == [ContentDelta(" \nAfter.")]  # prose around calls stays
    assert stream.finish() == []


def test_no_call_keeps_the_text_exactly():
    """Without a call the content must be the model's text to the character."""
    text = "  Plain answer with trailing space.\n\n"
    for family in ("llama3_json", "mistral", "hermes", "qwen3_coder"):
        assert parse_tool_calls(text, family) == (text, [])


@pytest.mark.parametrize(
    ("template", "architecture", "family"),
    [
        ("...<tool_call>\n<function=example_function_name>...", None, "qwen3_coder"),
        ('...<tool_call>\n{"name": <function-name>, ...}\n</tool_call>', None, "hermes"),
        ("{{ '[AVAILABLE_TOOLS]' }}...{{ '[TOOL_CALLS]' }}", "LlamaForCausalLM", "mistral"),
        ("<|start_header_id|>ipython<|end_header_id|>", None, "llama3_json"),
        ("{{ '<|python_tag|>' + tool_call.name }}", None, "llama3_json"),
        ("<|im_start|>{{ message.role }}", "Qwen2ForCausalLM", "hermes"),
        (None, "Qwen3MoeForCausalLM", "hermes"),
        (None, "MixtralForCausalLM", "mistral"),
        (None, "MistralForCausalLM", "mistral"),
        (None, "LlamaForCausalLM", "llama3_json"),
        ("{{ messages }}", "GPT2LMHeadModel", None),
        (None, None, None),
        (None, {"architectures": ["Qwen3ForCausalLM"]}, "hermes"),
        (None, {"model_type": "mistral"}, "mistral"),
        (None, {"architectures": []}, None),
    ],
)
def test_family_from_the_chat_template_else_the_architecture(template, architecture, family):
    """A wrong family parses nothing: every call of that checkpoint stays text."""
    assert family_for_checkpoint(template, architecture) == family


def test_the_flag_overrides_or_disables_detection(tmp_path):
    """An operator must be able to fix a wrong guess, or turn parsing off."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
    assert resolve_tool_family("auto", None, str(tmp_path)) == "mistral"
    assert resolve_tool_family("auto", "<tool_call>", str(tmp_path)) == "hermes"
    assert resolve_tool_family("hermes", "[TOOL_CALLS]", str(tmp_path)) == "hermes"
    assert resolve_tool_family("none", "<tool_call>", str(tmp_path)) is None
    assert resolve_tool_family("auto", None, None) is None
    with pytest.raises(ValueError, match="tool-call-parser"):
        resolve_tool_family("gpt", None, None)


PIECES = ['<tool_call>', '</tool_call>', '[TOOL_CALLS]', '[ARGS]', '[CALL_ID]', '<|python_tag|>',
          '<function=f>', '</function>', '<function=', '<parameter=limit>', '</parameter>',
          '{"name": "f", ', '"arguments": {"a": 1}', '"parameters": ', '}', '{', '[', ']', ';',
          '"', '\\', '\n',
          ' ', 'x', '1', 'é']  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    family=st.sampled_from(["llama3_json", "mistral", "hermes", "qwen3_coder"]),
    parts=st.lists(st.sampled_from(PIECES), max_size=30),
    cuts=st.lists(st.integers(0, 300), max_size=8),
)
def test_any_text_parses_without_error_and_streams_the_same(family, parts, cuts):
    """Whatever a model writes must come back (as text or calls), never as a 500."""
    text = "".join(parts)
    content, calls = parse_tool_calls(text, family, tools=WEATHER_TOOLS)
    assert all(isinstance(json.loads(c.arguments), dict) for c in calls)
    if not calls:
        assert content == text
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in itertools.pairwise(points)]
    assert replay(family, pieces)[:2] == (content, calls_of(calls))


# What Mistral-7B-Instruct-v0.3's template checks of each call id in the history.
MISTRAL_ID_CHECK = """{%- for message in messages %}{%- for call in message.tool_calls or [] %}
{%- if not (call.id is string and call.id|length == 9) %}
{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
{%- endif %}{{- call.id }}{%- endfor %}{%- endfor %}"""


def test_mistral_call_ids_pass_its_template_on_the_next_turn():
    """A `call_...` id sent back in the history makes Mistral's template refuse the turn."""
    from kvfleet.services.engine.api.chat_template import render_template

    _content, calls = parse_tool_calls('[TOOL_CALLS]f[ARGS]{"a": 1}', "mistral")
    history = [{"role": "assistant", "tool_calls": [{"id": calls[0].id, "type": "function"}]}]
    assert render_template(MISTRAL_ID_CHECK, history) == calls[0].id
