"""What a client hands the engine core and what it gets back (no RPC or HTTP types here)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ....kvstore.hashing import salt_extra_key
from .sampling_params import SamplingParams, TokenLogprob

if TYPE_CHECKING:
    from .grammar import CompiledGrammar


class InvalidRequestError(ValueError):
    """A request breaks a rule; `field` names the input at fault (first in the message)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class EngineStoppedError(RuntimeError):
    """The engine core stopped before the request finished."""


class SequenceFailedError(RuntimeError):
    """One request failed inside a step (say, its logits were not finite); others go on."""


@dataclass(frozen=True)
class GenerateCall:
    """One request: a prompt, how to sample it, and `num_samples` = 1 + child samples."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    conversation_id: str | None = None
    num_samples: int = 1
    # True when the output so far ends in a stop string (needs the tokenizer, so the caller
    # that has one builds it from `sampling.stop`).
    stop_check: Callable[[Sequence[int]], bool] | None = None
    cache_salt: str = ""  # requests share cached blocks only with the same salt
    # Prompt positions where later turns are likely to branch off (the end of the tools and
    # system prompt): the kvstore keeps a resume point there (its branch points).
    branch_hints: tuple[int, ...] = ()
    # `sampling.grammar` compiled for the model's tokenizer (by the caller that has it, as
    # `stop_check`); each sample steps a copy of its own.
    grammar: CompiledGrammar | None = None
    # The client's cache TTL: the conversation's retained turns are released after all others
    # for this long after its context end (`retained_order.py`); 0: the reuse policy's order.
    retention_seconds: int = 0

    @property
    def extra_key(self) -> bytes:
        """The block hash's extra key: the salt, so salted prefixes never match unsalted ones."""
        return salt_extra_key(self.cache_salt)


@dataclass(frozen=True)
class Usage:
    """What one finished sample cost and how fast it ran (engine-side timings)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_seconds: float
    mean_itl_seconds: float
    # Prompt tokens in whole blocks this request computed and committed to the prefix cache:
    # (prompt_tokens // block size) * block size - cached_tokens, never below 0. A trailing
    # partial block is computed but matches nothing later (matching is by whole blocks).
    cache_write_tokens: int = 0


@dataclass(frozen=True)
class ServedBy:
    """Which rank a router placed a request on, and why ("pinned", "new", "away", ...)."""

    rank_id: str
    placement: str


@dataclass(frozen=True)
class SampleOutput:
    """New tokens of one sample; `usage` and `finish_reason` come with `finished`;
    `served_by` with a request's first output, when a router placed it."""

    request_id: str
    sample_index: int
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str = ""
    usage: Usage | None = None
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, when the request asked for them
    served_by: ServedBy | None = None

    @classmethod
    def one_token(cls, request_id: str, sample_index: int, token: int) -> SampleOutput:
        """`SampleOutput(request_id, sample_index, (token,))`, built without the frozen
        dataclass's `object.__setattr__` per field: a decode step makes one per sequence."""
        output = object.__new__(cls)
        output.__dict__.update(
            request_id=request_id,
            sample_index=sample_index,
            token_ids=(token,),
            finished=False,
            finish_reason="",
            usage=None,
            logprobs=(),
            served_by=None,
        )
        return output


@dataclass(frozen=True)
class EngineLoad:
    """A rank's load, as its heartbeat reports it."""

    max_batch_size: int
    running: int
    queued: int
    kv_usage: float
    retained_pages: int
    kv_capacity_pages: int = 0  # usable pages of every pool: what retained_pages is a share of

    @property
    def retained_working_set(self) -> float:
        """Retained pages as a share of KV capacity, 0..1 (the autoscaler's signal)."""
        return self.retained_pages / self.kv_capacity_pages if self.kv_capacity_pages else 0.0

    @property
    def free_slots(self) -> int:
        return max(0, self.max_batch_size - self.running - self.queued)
