"""Constrained and free samples in one batch on a real engine core (the tiny random model),
eager and on the static decode path: the grammar's mask touches its own row only, its end ends
its sample, and a constrained request that breaks fails alone."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
from engine_testkit import TEST_CONFIG, final, greedy, make_core, run_together, tokens_of
from kvfleet.services.engine.api.grammar_spec import json_grammar
from kvfleet.services.engine.compute.sampling import SamplingParams
from kvfleet.services.engine.core.grammar_compiler import GrammarCompiler
from kvfleet.services.engine.model.tokenizer import stop_ids_of
from kvfleet.services.engine.request.engine_request import GenerateCall, SequenceFailedError
from kvfleet.services.engine.request.grammar import CompiledGrammar
from tool_call_kit import write_tool_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
GRAMMAR = json_grammar(SCHEMA, "response_format")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return write_tool_tokenizer(tmp_path_factory)


# The static-buffer decode path (what CUDA graphs replay) with the decode overlap, on CPU: the
# mask goes on its logits after the step, and its in-graph argmax must not be used.
STATIC = TEST_CONFIG.with_changes(decode_graphs="static", overlap_decode=True)


@pytest.fixture(params=[TEST_CONFIG, STATIC], ids=["eager", "static"])
def core(request):
    core = make_core(request.param, f"constrained-batch-{request.param.decode_graphs}")
    yield core
    core.check_integrity()
    core.stop()


def free_calls() -> list[GenerateCall]:
    return [
        GenerateCall("g0", tuple(range(3, 23)), greedy(12)),
        GenerateCall("g1", tuple(range(40, 58)), greedy(12)),
    ]


def constrained(tokenizer, request_id: str, grammar: CompiledGrammar, greedy_: bool = False):
    sampling = SamplingParams(temperature=0.0 if greedy_ else 1.0, seed=5, max_tokens=64,
                              stop_token_ids=stop_ids_of(tokenizer), grammar=GRAMMAR)  # fmt: skip
    return GenerateCall(request_id, tuple(range(90, 110)), sampling, grammar=grammar)


@pytest.mark.parametrize("greedy_", [False, True], ids=["sampled", "greedy"])
def test_a_constrained_sample_changes_only_its_own_row(core, tokenizer, greedy_):
    """The free requests' greedy tokens match a run without the constrained one, and the
    constrained one is valid JSON that ended at the grammar's end. Greedy: a batch of greedy
    rows would take its argmax on the device (static path: the graph's), never for a masked row."""
    clean = run_together(core, free_calls())
    grammar = GrammarCompiler(tokenizer).compile(GRAMMAR)
    mixed = run_together(core, [*free_calls(), constrained(tokenizer, "json", grammar, greedy_)])
    for call in free_calls():
        assert tokens_of(mixed[call.request_id]) == tokens_of(clean[call.request_id])
    assert final(mixed["json"]).finish_reason == "stop"
    jsonschema.validate(json.loads(tokenizer.decode(tokens_of(mixed["json"]))), SCHEMA)


def test_a_broken_grammar_fails_its_request_alone(core, tokenizer):
    """A sample whose grammar is in error (it refuses every token) fails; the others go on."""
    clean = run_together(core, free_calls())
    grammar = GrammarCompiler(tokenizer).compile(GRAMMAR)
    broken = grammar.start().matcher
    broken.consume_token(ord("x"))  # not JSON: the matcher is in error from now on
    assert broken.is_error()
    mixed = run_together(
        core, [*free_calls(), constrained(tokenizer, "bad", CompiledGrammar(broken, 264))]
    )
    assert isinstance(mixed["bad"], SequenceFailedError)
    for call in free_calls():
        assert tokens_of(mixed[call.request_id]) == tokens_of(clean[call.request_id])


def test_each_sample_of_a_request_steps_its_own_grammar(core, tokenizer):
    """n = 3 samples of one constrained request: each is whole, valid JSON of its own."""
    call = constrained(tokenizer, "three", GrammarCompiler(tokenizer).compile(GRAMMAR))
    outputs = run_together(core, [dataclasses.replace(call, num_samples=3)])["three"]
    for sample in range(3):
        assert final(outputs, sample).finish_reason == "stop"
        text = tokenizer.decode(tokens_of(outputs, sample))
        jsonschema.validate(json.loads(text), SCHEMA)
