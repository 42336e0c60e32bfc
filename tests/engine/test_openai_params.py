"""OpenAI sampling parameters against plain references computed here on the real tiny model:
penalties (applied by hand to its logits), logprobs (its log-softmax), stop strings."""

from __future__ import annotations

import math

import openai
import pytest
import torch
from engine_testkit import TEST_CONFIG, greedy, make_core, run_call, shared_compute, tokens_of
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.compute.generation import lone_sequence_pages
from kvfleet.services.engine.compute.sampling import SamplingParams
from kvfleet.services.engine.core.detokenizer import StopText, first_stop
from kvfleet.services.engine.kv.kv_cache import PagedKVCache
from kvfleet.services.engine.model.tokenizer import ByteTokenizer
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.engine.request.engine_request import GenerateCall
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig

PER_REQUEST = TEST_CONFIG.with_changes(reuse_policy="per_request")
PROMPT = [ord(c) for c in "the cat sat on the mat and the cat"]


def reference_logits(tokens: list[int]) -> list[float]:
    """The tiny model's next-token logits after `tokens`: one plain prefill in a fresh cache."""
    compute = shared_compute(TEST_CONFIG)
    cache = PagedKVCache(compute.model_config, 64, TEST_CONFIG.page_size)
    chunk = SequenceChunk(tokens, 0, lone_sequence_pages(cache, len(tokens)))
    with torch.no_grad():
        logits = compute.model(ForwardBatch.build([chunk], cache), cache, compute.attention)
    return logits[0].tolist()


def penalized_greedy(prompt: list[int], steps: int, presence, frequency, repetition) -> list[int]:
    """Greedy decoding with the penalties applied by hand, token by token, in plain Python."""
    out: list[int] = []
    for _ in range(steps):
        logits = reference_logits(prompt + out)
        for token in set(prompt) | set(out):
            value = logits[token]
            logits[token] = value / repetition if value > 0 else value * repetition
        for token in set(out):
            logits[token] -= frequency * out.count(token) + presence
        out.append(max(range(len(logits)), key=logits.__getitem__))
    return out


@pytest.fixture(scope="module")
def core():
    core = make_core(PER_REQUEST, storage="params")
    yield core
    core.stop()


@pytest.mark.parametrize(
    ("presence", "frequency", "repetition"),
    [(0.0, 1.5, 1.0), (1.2, 0.0, 1.0), (0.0, 0.0, 1.8), (0.5, 0.7, 1.3), (-1.0, -0.5, 0.8)],
)
def test_penalties_match_a_hand_computed_reference(core, presence, frequency, repetition):
    """Penalties the sampler ignores (or applies to the wrong tokens) change no output."""
    params = SamplingParams(temperature=0.0, max_tokens=10, presence_penalty=presence,
                            frequency_penalty=frequency, repetition_penalty=repetition)  # fmt: skip
    got = tokens_of(run_call(core, GenerateCall(f"p{presence}{frequency}", tuple(PROMPT), params)))
    plain = tokens_of(run_call(core, GenerateCall(f"g{presence}{frequency}", tuple(PROMPT),
                                                  greedy(10))))  # fmt: skip
    assert got == penalized_greedy(PROMPT, 10, presence, frequency, repetition)
    assert got != plain  # the penalties did change the answer, so the comparison means something


@pytest.fixture(scope="module", params=["rank", "fleet"])
def client(request):
    if request.param == "rank":
        rank = EngineRank(PER_REQUEST, RankAddresses(http_port=0, rank_id="params")).start()
        base, stop = f"http://127.0.0.1:{rank.http_port}/v1", lambda: rank.stop(grace=0.5)
    else:
        fleet = EmbeddedFleet(FleetConfig(PER_REQUEST, num_ranks=1, redis_url=None)).start()
        base, stop = fleet.http_base_url, fleet.stop
    with openai.OpenAI(base_url=base, api_key="x", max_retries=0) as client:
        yield client
    stop()


def test_completion_logprobs_are_the_models_log_softmax(client):
    """Logprobs that are not the model's distribution mislead every scorer built on them."""
    answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0,
                                       logprobs=3, extra_body={"ignore_eos": True})  # fmt: skip
    logprobs = answer.choices[0].logprobs
    text = ByteTokenizer()
    context = list(PROMPT)
    for token_text, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs,
                                        logprobs.top_logprobs, strict=True):  # fmt: skip
        logits = torch.tensor(reference_logits(context), dtype=torch.float64)
        expected = torch.log_softmax(logits, -1)
        token = int(expected.argmax())
        assert token_text == text.decode([token])
        assert math.isclose(logprob, float(expected[token]), abs_tol=1e-4)
        best = expected.topk(3).values.tolist()  # top's keys are texts: equal texts merge
        assert 1 <= len(top) <= 3 and math.isclose(max(top.values()), logprob, abs_tol=1e-6)
        assert all(any(math.isclose(v, b, abs_tol=1e-4) for b in best) for v in top.values())
        context.append(token)


def test_return_token_ids_streams_every_step_with_its_ids(client):
    """If this fails, a client that times tokens (the replay's TTFT) times text instead: a
    step whose text is held back (a partial character) sends nothing without the ids."""
    ask = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    ids = {"ignore_eos": True, "return_token_ids": True}
    whole = client.completions.create(**ask, extra_body=ids).model_dump()["choices"][0]
    chunks = [c.model_dump() for c in client.completions.create(**ask, stream=True,
                                                                extra_body=ids)]  # fmt: skip
    streamed = [c["choices"][0]["token_ids"] for c in chunks if c["choices"]]
    assert [len(step) for step in streamed] == [1] * 12  # one chunk per decode step
    assert [t for step in streamed for t in step] == whole["token_ids"]
    assert len(whole["token_ids"]) == 12
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    plain = client.completions.create(**ask, extra_body={"ignore_eos": True}).model_dump()
    assert "token_ids" not in plain["choices"][0]  # only when asked


def test_chat_logprobs_have_the_chat_shape(client):
    """Chat clients read `logprobs.content[i].top_logprobs`; the legacy shape breaks them."""
    answer = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True},
    )  # fmt: skip
    content = answer.choices[0].logprobs.content
    assert len(content) == 3
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0.0
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def stop_from(text: str) -> tuple[str, int]:
    """A two-character stop string from the middle of `text` and where it first occurs."""
    for start in range(3, len(text) - 2):
        piece = text[start : start + 2]
        if "\ufffd" not in piece and piece.isprintable():
            return piece, text.index(piece)
    raise AssertionError(f"no printable piece in {text!r}")


def test_stop_strings_cut_the_text_and_end_the_sample(client):
    """A stop string ignored, left in the text or generating on to max_tokens breaks agents
    that stop on a marker."""
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
            "extra_body": {"ignore_eos": True}}  # fmt: skip
    full = client.completions.create(**body).choices[0].text
    stop, at = stop_from(full)
    answer = client.completions.create(**body, stop=[stop, "never-there"])
    assert answer.choices[0].text == full[:at]
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens < 24  # the engine stopped, not just the text
    chunks = list(client.completions.create(**body, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full[:at]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_streamed_text_holds_back_what_may_start_a_stop_string():
    """A client must never see the start of a stop string that then completes."""
    stops = StopText(("</end>",))
    pieces = [stops.feed(0, piece, False) for piece in ("hello <", "/e", "x", " then </", "en")]
    assert pieces == ["hello ", "", "</ex", " then ", ""]
    assert stops.feed(0, "d> tail", True) == "" and 0 in stops.stopped
    assert StopText(("ab",)).feed(0, "xa", True) == "xa"  # the end releases what was held


def test_overlapping_stop_strings_cut_where_the_first_starts():
    """Of overlapping stops the earliest start wins, whichever is listed first or ends first:
    cutting at a later one leaks the start of the earlier stop string to the client."""
    assert first_stop("xab", ("b", "ab")) == first_stop("xab", ("ab", "b")) == 1
    assert StopText(("b", "ab")).feed(0, "xab", False) == "x"
    stops = StopText(("b", "ab"))
    assert [stops.feed(0, piece, False) for piece in "xab"] == ["x", "", ""]
    assert 0 in stops.stopped
