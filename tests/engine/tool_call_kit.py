"""What the tool-call tests of both HTTP APIs share: a chat template that renders tools, calls
and results (ChatML, as Qwen2.5 writes them), a byte tokenizer whose call markers are special
tokens, one tool and the call each family's model writes for it, and a scripted engine whose
compute answers every request with a fixed token sequence.

The tokenizer makes every call marker a special token, as Mistral and Llama checkpoints do:
decoding for the client drops special tokens, so the markers reach the parser only if the app
keeps them.
"""

from __future__ import annotations

import json

import pytest
from kvfleet.services.engine.api.http_backends import EngineBackend
from kvfleet.services.engine.compute.compute_sim import SimCompute
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.model.tokenizer import byte_tokenizer_json, load_model_tokenizer

MARKERS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *MARKERS)

# ChatML as Qwen2.5 writes tools, earlier calls (arguments as the OpenAI path's JSON text or
# the Messages path's object: Qwen2.5's template takes both) and tool results; each tool is
# headed by its name, as Qwen3-Coder's template reads `tool.function.name` (a bad tool makes
# it fail).
TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n# Tools\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + tool.function.name + ': ' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\nCall a function inside <tool_call></tool_call> tags.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant\\n' + (message.content or '') }}
{%- for call in message.tool_calls %}
{{- '\\n<tool_call>\\n{"name": "' + call.function.name + '", "arguments": ' }}
{%- if call.function.arguments is string %}{{- call.function.arguments }}
{%- else %}{{- call.function.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content }}
{{- '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The forecast of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
ARGUMENTS = {"city": "Paris", "days": 3}

# What each family's model writes for the same call (family, text, content left over).
ANSWERS = {
    "hermes": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "days": 3}}\n</tool_call>',
        "Let me check.",
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        None,
    ),
    "mistral": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}', None),
    "llama3_json": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
        None,
    ),
}


class ScriptedCompute(SimCompute):
    """The sim backend answering every sample with `script`, token by token, then `after`
    (the EOS id, or any token to see what a request does past its script)."""

    def __init__(self, config: EngineConfig, after: int) -> None:
        super().__init__(config)
        self.script: list[int] = []
        self.after = after

    def token_for(self, chunk) -> int:
        done = len(chunk.sequence.output)
        return self.script[done] if done < len(self.script) else self.after


def write_tool_tokenizer(tmp_path_factory, specials=SPECIALS, template=TEMPLATE):
    """A byte tokenizer directory with `specials` (default: the markers too) as special tokens,
    `<|im_end|>` as its eos and `template` as its chat template."""
    path = tmp_path_factory.mktemp("tool-tokenizer")
    (path / "tokenizer.json").write_text(byte_tokenizer_json(specials))
    config = {"eos_token": "<|im_end|>", "chat_template": template}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return load_model_tokenizer(path)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return write_tool_tokenizer(tmp_path_factory)


@pytest.fixture(scope="module")
def engine(tokenizer):
    """The scripted engine core behind an EngineBackend, and its compute (set `.script`)."""
    config = EngineConfig(model="tiny", compute_backend="sim", sim_time_scale=0.0,
                          max_batch_size=2, kv_pages=64)  # fmt: skip
    compute = ScriptedCompute(config, tokenizer.eos_id)
    core = EngineCore(config, compute=compute).start()
    yield EngineBackend(core, tokenizer, ("tiny",)), compute
    core.stop()
