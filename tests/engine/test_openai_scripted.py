"""What a client gets back for a known model answer, through a real engine core, the HTTP app
on a real port and the `openai` client: the reply ends at the model's eos without
`ignore_eos`, at the first of overlapping stop strings, and a chat without `max_tokens` runs
to its end (or to the context's) where a completion keeps OpenAI's default of 16 tokens.

The compute is scripted (the sim backend with no sleeping, answering a fixed token sequence);
the tokenizer is the byte tokenizer with `<|im_end|>` as its eos.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from kvfleet.services.engine.api.http_backends import EngineBackend
from kvfleet.services.engine.api.http_server import HttpServer
from kvfleet.services.engine.api.openai_http import build_app
from kvfleet.services.engine.compute.compute_sim import SimCompute
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.request.engine_request import GenerateCall, InvalidRequestError
from kvfleet.services.engine.request.sampling_params import SamplingParams
from tool_call_kit import ScriptedCompute, write_tool_tokenizer

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TEMPLATE = """{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""
CONTEXT = 128  # max_model_len: a chat without max_tokens may run to it
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return write_tool_tokenizer(tmp_path_factory, SPECIALS, TEMPLATE)


@pytest.fixture(scope="module")
def served(tokenizer):
    """(openai client, scripted compute, backend) over one engine core and one HTTP server."""
    config = EngineConfig(model="tiny", compute_backend="sim", sim_time_scale=0.0,
                          max_batch_size=2, kv_pages=64, max_model_len=CONTEXT)  # fmt: skip
    compute = ScriptedCompute(config, after=ord("."))  # past the script: no eos, ever
    core = EngineCore(config, compute=compute).start()
    backend = EngineBackend(core, tokenizer, ("tiny",))
    server = HttpServer(build_app(backend)).start()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x",
                           max_retries=0)  # fmt: skip
    with client:
        yield client, compute, backend
    server.stop()
    core.stop()


def answer(served, *parts: str | None) -> None:
    """Script the model's next answers: texts, None standing for its eos token."""
    _client, compute, backend = served
    tokenizer = backend.tokenizer
    compute.script = [t for p in parts for t in ([tokenizer.eos_id] if p is None else
                                                 tokenizer.encode(p))]  # fmt: skip


def chat(client, stream: bool = False, **extra) -> tuple[str, str, int | None]:
    """(text, finish reason, completion tokens) of a chat request, streamed or not."""
    if not stream:
        reply = client.chat.completions.create(model="tiny", messages=MESSAGES, **extra)
        choice = reply.choices[0]
        return choice.message.content, choice.finish_reason, reply.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True,
                                                 stream_options={"include_usage": True},
                                                 **extra))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    return text, reasons[-1], chunks[-1].usage.completion_tokens


def complete(client, stream: bool = False, **extra) -> tuple[str, str, int | None]:
    """(text, finish reason, completion tokens) of a completion request, streamed or not."""
    if not stream:
        reply = client.completions.create(model="tiny", prompt="hi", **extra)
        choice = reply.choices[0]
        return choice.text, choice.finish_reason, reply.usage.completion_tokens
    chunks = list(client.completions.create(model="tiny", prompt="hi", stream=True,
                                            stream_options={"include_usage": True},
                                            **extra))  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    return text, reasons[-1], chunks[-1].usage.completion_tokens


ASK = {"chat": chat, "completion": complete}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", list(ASK))
def test_the_reply_ends_at_the_models_eos(served, kind, stream):
    """Without `ignore_eos` the tokenizer's eos ends the answer: an engine that never stops
    there talks past the end of every turn, up to max_tokens."""
    answer(served, "Hello", None, " world")
    ask = ASK[kind]
    assert ask(served[0], stream, max_tokens=12) == ("Hello", "stop", 6)
    text, reason, _ = ask(served[0], stream, max_tokens=12, extra_body={"ignore_eos": True})
    assert (text, reason) == ("Hello world", "length")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", list(ASK))
def test_overlapping_stop_strings_cut_at_the_first(served, kind, stream):
    """Stop "ab" starts before stop "b": the text ends where the earliest stop starts."""
    answer(served, "xab and more")
    text, reason, _ = ASK[kind](served[0], stream, max_tokens=10, stop=["b", "ab"])
    assert (text, reason) == ("x", "stop")


def test_a_chat_without_max_tokens_runs_to_its_end(served):
    """OpenAI's chat default is the context left: a 16-token default cuts every answer short."""
    reply = "A reply well over sixteen tokens long, ending on its own."
    answer(served, reply, None)
    assert chat(served[0]) == (reply, "stop", len(reply) + 1)
    assert chat(served[0], stream=True) == (reply, "stop", len(reply) + 1)


def test_a_chat_without_max_tokens_stops_at_the_context_end(served):
    """With no eos, the default stops where the context does (not a 400 for prompt + default
    over the context)."""
    answer(served)
    reply = served[0].chat.completions.create(model="tiny", messages=MESSAGES)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens == CONTEXT


def test_the_longest_request_is_what_the_pools_hold_when_less_than_the_context():
    """A default `max_tokens` of the whole context would be refused where the KV pools hold
    less than a context for one request: the default stops at what validates."""
    config = EngineConfig(model="tiny", compute_backend="sim", sim_time_scale=0.0,
                          max_batch_size=2, kv_pages=6, max_model_len=CONTEXT)  # fmt: skip
    core = EngineCore(config, compute=SimCompute(config)).start()
    try:
        longest = core.max_request_tokens()
        assert 0 < longest < CONTEXT
        sampling = SamplingParams(max_tokens=longest - 4)
        core.validate(GenerateCall("fits", (1, 2, 3, 4), sampling))
        with pytest.raises(InvalidRequestError, match="pages > pool"):
            core.validate(GenerateCall("over", (1, 2, 3, 4, 5), sampling))
    finally:
        core.stop()


def test_a_completion_without_max_tokens_keeps_the_legacy_16(served):
    """Completions keep OpenAI's legacy default of 16 tokens."""
    answer(served, "A reply well over sixteen tokens long.", None)
    assert complete(served[0]) == ("A reply well ove", "length", 16)


@pytest.mark.parametrize(
    ("path", "field", "body"),
    [
        ("chat/completions", "stream", {"messages": MESSAGES}),
        ("chat/completions", "logprobs", {"messages": MESSAGES}),
        ("chat/completions", "ignore_eos", {"messages": MESSAGES}),
        ("completions", "stream", {"prompt": "hi"}),
        ("completions", "echo", {"prompt": "hi"}),
        ("completions", "ignore_eos", {"prompt": "hi"}),
        ("messages", "stream", {"messages": MESSAGES, "max_tokens": 4}),
    ],
)
@pytest.mark.parametrize("value", ["yes", "true", 1, 0])
def test_flags_are_strict_booleans(served, path, field, body, value):
    """`"stream": "yes"` read as true (or `0` as false) answers a shape the client did not ask
    for; a 400 naming the field says what to fix."""
    base = str(served[0].base_url)
    reply = httpx.post(f"{base}{path}", json={"model": "tiny", field: value, **body}, timeout=10)
    assert reply.status_code == 400, reply.text
    assert field in reply.json()["error"]["message"]
    if path != "messages":  # Anthropic's error body has no `param`
        assert reply.json()["error"]["param"] == field
