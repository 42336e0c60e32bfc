"""A model directory's own chat template renders exactly what transformers'
`apply_chat_template` renders (tools, tool calls, generation prompt, special tokens), and the
tokenizer files' special tokens and generation_config's eos ids are read as transformers reads
them."""

from __future__ import annotations

import json

import pytest
from kvfleet.services.engine.api.chat_template import render_chat, render_template
from kvfleet.services.engine.model.tokenizer import (
    byte_tokenizer_json,
    load_model_tokenizer,
    stop_ids_of,
)
from kvfleet.services.engine.request.engine_request import InvalidRequestError

pytest.importorskip("transformers")

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# A Qwen-style template: tools as JSON, tool calls, tool results, block tags without `-` (so
# trim_blocks/lstrip_blocks matter), a namespace, loop controls and raise_exception.
TEMPLATE = """{{ bos_token }}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- '# Tools\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(turns=0) %}
{% for message in messages %}
    {% if message.role not in ['system', 'user', 'assistant', 'tool'] %}
        {{ raise_exception('Unknown role: ' + message.role) }}
    {% endif %}
    {% if message.role == 'system' %}{% continue %}{% endif %}
    {% set ns.turns = ns.turns + 1 %}
    {% if message.role == 'assistant' and message.tool_calls %}
<|im_start|>assistant
        {% for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
        {% endfor %}
<|im_end|>
    {% elif message.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
    {% else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city — returns °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Wetter in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
            }
        ],
    },
    {"role": "tool", "content": "21"},
    {"role": "assistant", "content": "21 °C."},
    {"role": "user", "content": "Und morgen?"},
]


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json(SPECIALS))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": {"__type": "AddedToken", "content": "<|endoftext|>", "special": True},
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": TEMPLATE,
            }
        )
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [258, 256]}))
    return tmp_path


@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_template_renders_what_transformers_renders(model_dir, tools, add_generation_prompt):
    """Any difference in the Jinja environment or the variables changes the prompt text."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(model_dir)
    expected = hf.apply_chat_template(
        MESSAGES, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    ours = load_model_tokenizer(model_dir)
    text = render_template(
        ours.chat_template, MESSAGES, tools, add_generation_prompt, ours.special_tokens
    )
    assert text == expected
    assert ('"Weather in a city — returns °C"' in text) == (tools is not None)  # non-ASCII kept
    ids = render_chat(MESSAGES, ours, tools=tools, add_generation_prompt=add_generation_prompt)
    assert ids == hf(expected, add_special_tokens=False)["input_ids"]
    assert ids.count(ours.special_token_ids["<|im_start|>"]) == expected.count("<|im_start|>")


def test_special_tokens_and_generation_stop_ids(model_dir):
    """eos from tokenizer_config, every eos of generation_config.json as a stop token."""
    tok = load_model_tokenizer(model_dir)
    assert (tok.bos_id, tok.eos_id) == (256, 258)
    assert tok.special_tokens["bos_token"] == "<|endoftext|>"
    assert stop_ids_of(tok) == (258, 256)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": 257}))
    assert stop_ids_of(load_model_tokenizer(model_dir)) == (257,)
    (model_dir / "generation_config.json").unlink()
    assert stop_ids_of(load_model_tokenizer(model_dir)) == (258,)


def test_template_raise_exception_is_a_client_error(model_dir):
    """A template's raise_exception must reach the client as a 400 naming messages."""
    tok = load_model_tokenizer(model_dir)
    with pytest.raises(InvalidRequestError, match="Unknown role: robot") as error:
        render_chat([{"role": "robot", "content": "hi"}], tok)
    assert error.value.field == "messages"


def test_chat_template_jinja_file_wins(model_dir):
    """transformers 5 saves the template as chat_template.jinja beside the config."""
    (model_dir / "chat_template.jinja").write_text("{{ messages[0].content }}!")
    tok = load_model_tokenizer(model_dir)
    assert tok.decode(render_chat([{"role": "user", "content": "hey"}], tok)) == "hey!"
