"""How one request picks its tokens, and what the sampler hands back per row (no torch here).

Kept apart from the torch sampler so the HTTP front (which also runs in the router process)
validates requests without importing torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

# Temperatures below this are greedy: their softmax is a one-hot in any float type, and
# dividing logits by them overflows.
SAMPLING_EPS = 1e-5
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens; temperature 0 (or below SAMPLING_EPS) means greedy.

    Penalties follow OpenAI/vLLM: `presence_penalty` and `frequency_penalty` subtract from the
    logits of tokens already generated (once, or per occurrence); `repetition_penalty` divides
    positive (multiplies negative) logits of tokens in the prompt or the output. `logprobs`:
    None = none; k = the sampled token's log probability plus the k most likely. `grammar`:
    each token is drawn from those the grammar allows next, and its end ends the sample.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    # An llguidance grammar (grammar_spec.py) the output must match; "" = unconstrained.
    grammar: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2.0 <= value <= 2.0):
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not (math.isfinite(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 10.0):
            raise ValueError(
                f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}"
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @functools.cached_property  # NOTE: read per row every step (frozen: computed once)
    def plain_greedy(self) -> bool:
        """Greedy with nothing to apply or report (no penalty, logprobs or grammar): the batch's
        argmax on the device will do."""
        return self.greedy and not self.penalized and self.logprobs is None and not self.grammar

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )

    def is_stop(self, token: int) -> bool:
        """Whether generating `token` ends the request."""
        return token in self.stop_token_ids


@dataclass(frozen=True)
class TokenLogprob:
    """The sampled token's log probability and the most likely alternatives (raw model logits)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SampledToken:
    """A sampled token with its log probabilities (rows that asked for logprobs)."""

    token: int
    logprobs: TokenLogprob


@dataclass(frozen=True)
class SampleFailure:
    """A row that could not be sampled (non-finite logits): its request fails, the batch goes on."""

    message: str


RowResult = int | SampledToken | SampleFailure  # what the sampler hands back for one row
