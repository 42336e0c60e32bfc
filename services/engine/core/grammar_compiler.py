"""Compiling a request's grammar against the model's tokenizer.

A request's grammar (grammar_spec.py, as text in its sampling params) is compiled once per
request by the thread that submits it (compiling can take a while and releases the GIL, so it
never holds up the core thread); its samples then step copies of it (grammar.py).
"""

from __future__ import annotations

import threading

from llguidance import LLMatcher, LLTokenizer

from ..model.tokenizer import Tokenizer, stop_ids_of
from ..request.engine_request import InvalidRequestError
from ..request.grammar import CompiledGrammar
from ..request.sampling_params import SamplingParams


class GrammarCompiler:
    """Compiles grammars against one tokenizer (llguidance's view of it, built on first use:
    about a second for a large vocabulary)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._lltokenizer: LLTokenizer | None = None
        self._lock = threading.Lock()  # request threads compile at once

    @property
    def lltokenizer(self) -> LLTokenizer:
        with self._lock:
            if self._lltokenizer is None:
                text = self._tokenizer.to_json()
                # A finished grammar allows only these: the model's stop ids (its eos).
                eos = list(stop_ids_of(self._tokenizer)) or None
                self._lltokenizer = LLTokenizer(text, eos_token=eos)
            return self._lltokenizer

    def compile(self, grammar: str, field: str = "sampling.grammar") -> CompiledGrammar:
        """The compiled grammar; InvalidRequestError naming `field` when it does not compile."""
        matcher = LLMatcher(self.lltokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(field, f"bad grammar: {matcher.get_error()}")
        return CompiledGrammar(matcher, self.lltokenizer.vocab_size)


def compile_grammar(compiler: GrammarCompiler, sampling: SamplingParams) -> CompiledGrammar | None:
    """`sampling.grammar` compiled (None when the request has none)."""
    return compiler.compile(sampling.grammar) if sampling.grammar else None
