"""Grammar state per sample: which tokens may come next, and whether the grammar has ended.

A request's grammar (grammar_spec.py, as text in its sampling params) is compiled once per
request by the thread that submits it (compiling can take a while and releases the GIL, so it
never holds up the core thread); each sample then steps its own copy on the core thread: the
mask before a step samples it, one token after. No torch here: grammar_mask.py applies masks.
"""

from __future__ import annotations

import threading

from llguidance import LLMatcher, LLTokenizer

from .engine_request import InvalidRequestError
from .sampling_params import SamplingParams
from .tokenizer import Tokenizer, stop_ids_of


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


class CompiledGrammar:
    """One request's grammar, at its start; `start()` gives each sample a state of its own."""

    def __init__(self, matcher: LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size

    def start(self) -> GrammarState:
        return GrammarState(self._matcher.deep_copy(), self.vocab_size)


class GrammarState:
    """Where one sample is in its grammar (core thread only)."""

    def __init__(self, matcher: LLMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size  # the grammar's vocabulary: mask bits per row

    def accept(self, token: int) -> str | None:
        """Advance past `token`; None, or why the grammar refused it."""
        # NOTE: a matcher in error masks all but eos and takes it: that must not pass for an end.
        if self.matcher.consume_token(token) and not self.matcher.is_error():
            return None
        return f"token {token} breaks the request's grammar: {self.matcher.get_error()}"

    @property
    def ended(self) -> bool:
        """True once the grammar allows nothing more (the sample is complete)."""
        return self.matcher.is_stopped()
