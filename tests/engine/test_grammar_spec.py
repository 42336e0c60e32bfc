"""The call grammars against the parser: what each family's model writes (the tool kit's
answers) is what its grammar allows, with the markers as special tokens or as plain text, and
a forced grammar allows nothing else first. No model: the tokens are the answers' own."""

from __future__ import annotations

import pytest
from kvfleet.services.engine.api.grammar_spec import ToolMode, ToolSpec, json_grammar, tool_grammar
from kvfleet.services.engine.core.grammar_compiler import GrammarCompiler
from kvfleet.services.engine.request.engine_request import InvalidRequestError
from tool_call_kit import ANSWERS, SPECIALS, TEMPLATE, TOOLS, write_tool_tokenizer

PLAIN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # markers are text
SPEC = [ToolSpec("get_weather", TOOLS[0]["function"]["parameters"], "tools[0]")]
MODES = {
    "required": ToolMode(True),
    "named": ToolMode(True, "get_weather", parallel=False),
    "strict-auto": ToolMode(False),
}


@pytest.fixture(scope="module", params=[SPECIALS, PLAIN_SPECIALS], ids=["special", "text"])
def tokenizer(tmp_path_factory, request):
    return write_tool_tokenizer(tmp_path_factory, request.param, TEMPLATE)


def consumed(tokenizer, grammar: str, text: str) -> str | None:
    """Feed `text`'s tokens to a fresh state; None when all pass and the grammar may end."""
    state = GrammarCompiler(tokenizer).compile(grammar).start()
    for token in tokenizer.encode(text):
        problem = state.accept(token)
        if problem:
            return problem
    return None if state.matcher.is_accepting() else "the grammar is not complete"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("family", list(ANSWERS))
def test_what_the_family_writes_is_what_its_grammar_allows(tokenizer, family, mode):
    """A grammar that refuses a family's own syntax would force calls its parser cannot read."""
    text, content = ANSWERS[family]
    if family == "mistral" and "[ARGS]" not in tokenizer.special_token_ids:
        pytest.skip("without an [ARGS] token the grammar writes the older array form")
    if family == "llama3_json":
        text = text.removeprefix("<|python_tag|>")  # the grammar writes the bare JSON form
    if content and MODES[mode].forced:
        text = text.removeprefix(content).lstrip("\n")  # a forced call comes first
    specials = tokenizer.special_token_ids
    assert consumed(tokenizer, tool_grammar(family, SPEC, MODES[mode], specials), text) is None


@pytest.mark.parametrize("family", list(ANSWERS))
def test_a_forced_call_allows_no_text_first_and_auto_allows_plain_text(tokenizer, family):
    specials = tokenizer.special_token_ids
    forced = tool_grammar(family, SPEC, MODES["required"], specials)
    assert consumed(tokenizer, forced, "It is sunny.") is not None
    auto = tool_grammar(family, SPEC, MODES["strict-auto"], specials)
    assert consumed(tokenizer, auto, "It is sunny.") is None


@pytest.mark.parametrize(
    "schema",
    [{"type": "nosuch"}, {"$ref": "#/$defs/gone"}, {"properties": {"a": {"type": 5}}}, [1], "x"],
)
def test_a_schema_that_does_not_compile_names_its_field(schema):
    with pytest.raises(InvalidRequestError) as error:
        json_grammar(schema, "response_format.json_schema.schema")
    assert error.value.field == "response_format.json_schema.schema"
    with pytest.raises(InvalidRequestError) as error:
        tool_grammar("hermes", [ToolSpec("f", schema, "tools[3].function.parameters")],
                     ToolMode(True), {})  # fmt: skip
    assert error.value.field == "tools[3].function.parameters"
