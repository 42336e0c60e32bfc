"""One sample being generated: its tokens, sampler and timings (owned by the core thread)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .engine_request import GenerateCall
from .sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from .grammar import GrammarState


@dataclass(eq=False)
class Sequence:
    """A sample of a request; `key` is what the kvstore manager tracks it by.

    `kv_prompt_len` is the prompt the manager saw (longer than the client's prompt after a
    preemption re-added the sequence with its output so far); `retain` says whether its context
    end still counts as a conversation turn.
    """

    key: str
    call: GenerateCall
    sample_index: int
    sampling: SamplingParams
    generator: torch.Generator | None
    arrived_at: float
    parent: Sequence | None = None
    output: list[int] = field(default_factory=list)
    kv_prompt_len: int = 0
    context_done: bool = False
    retain: bool = True
    admitted: bool = False
    cached_tokens: int | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    itl_total: float = 0.0
    finished: bool = False
    grammar: GrammarState | None = None  # where a constrained sample is in its grammar

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.call.prompt_token_ids

    @property
    def conversation_id(self) -> str | None:
        """The conversation the request belongs to (its retained turns are kept per one)."""
        return self.call.conversation_id

    @property
    def retention_seconds(self) -> float:
        """How long the client asked its turn kept (its cache TTL; 0: the reuse policy's)."""
        return self.call.retention_seconds

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far."""
        return len(self.call.prompt_token_ids) + len(self.output)

    def tokens(self, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of prompt + output."""
        prompt, n = self.call.prompt_token_ids, len(self.call.prompt_token_ids)
        if stop <= n:
            return list(prompt[start:stop])
        if start >= n:
            return self.output[start - n : stop - n]
        return [*prompt[start:], *self.output[: stop - n]]

    def token_at(self, position: int) -> int:
        """Token `position` of prompt + output."""
        prompt = self.call.prompt_token_ids
        n = len(prompt)
        return prompt[position] if position < n else self.output[position - n]

    def ready(self) -> bool:
        """A child sample waits until its parent's prompt is computed, to reuse its prefix."""
        return self.parent is None or self.parent.context_done or self.parent.finished
