"""Grammar state per sample: which tokens may come next, and whether the grammar has ended.

A request's grammar arrives compiled (grammar_compiler.py, on the thread that submits it);
each sample then steps its own copy on the core thread: the mask before a step samples it, one
token after. No torch here: grammar_mask.py applies masks.
"""

from __future__ import annotations

from llguidance import LLMatcher


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
