"""Client inputs to engine calls: sampling values checked once, errors that name the field."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .engine_request import InvalidRequestError
from .sampling_params import MAX_TOP_LOGPROBS, SamplingParams

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000  # the engine decodes a tail about 4x this long per token


def make_sampling(
    *,
    temperature: float | None,
    top_p: float | None,
    seed: int | None,
    max_tokens: int | None,
    stop_token_ids: Sequence[int] = (),
    default_max_tokens: int = 16,
    prefix: str = "",
    stop: Sequence[str] = (),
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    repetition_penalty: float | None = None,
    logprobs: int | None = None,
    grammar: str = "",
) -> SamplingParams:
    """SamplingParams from client values; InvalidRequestError names the bad field."""
    temperature = 1.0 if temperature is None else float(temperature)
    top_p = 1.0 if top_p is None else float(top_p)
    max_tokens = default_max_tokens if max_tokens is None else int(max_tokens)
    if not math.isfinite(temperature) or not 0.0 <= temperature <= 100.0:
        raise InvalidRequestError(f"{prefix}temperature", f"{temperature} not in [0, 100]")
    if not math.isfinite(top_p) or not 0.0 < top_p <= 1.0:
        raise InvalidRequestError(f"{prefix}top_p", f"{top_p} not in (0, 1]")
    if max_tokens < 1:
        raise InvalidRequestError("max_tokens", f"{max_tokens} must be >= 1")
    if seed is not None and not 0 <= int(seed) < 2**63:
        raise InvalidRequestError(f"{prefix}seed", f"{seed} not in [0, 2**63)")
    penalties = {
        "presence_penalty": (presence_penalty, 0.0, -2.0, 2.0),
        "frequency_penalty": (frequency_penalty, 0.0, -2.0, 2.0),
        "repetition_penalty": (repetition_penalty, 1.0, 1e-9, 10.0),
    }
    values = {}
    for name, (value, default, low, high) in penalties.items():
        value = default if value is None else float(value)
        if not math.isfinite(value) or not low <= value <= high:
            raise InvalidRequestError(f"{prefix}{name}", f"{value} not in [{low:g}, {high:g}]")
        values[name] = value
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"{prefix}stop", f"{len(stop)} strings > {MAX_STOP_STRINGS}")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        raise InvalidRequestError(f"{prefix}stop", f"a stop string over {MAX_STOP_CHARS} chars")
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequestError(f"{prefix}logprobs", f"{logprobs} not in 0..{MAX_TOP_LOGPROBS}")
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        seed=None if seed is None else int(seed),
        max_tokens=max_tokens,
        stop_token_ids=tuple(int(t) for t in stop_token_ids),
        stop=tuple(s for s in stop if s),
        logprobs=logprobs,
        grammar=grammar,
        **values,
    )


MAX_BRANCH_HINTS = 8  # each one the kvstore plans for pins a window (and snapshot) of pages


MAX_RETENTION_SECONDS = 24 * 3600  # OpenAI's longest prompt_cache_retention


def retention_seconds_of(seconds: int) -> int:
    """A request's cache TTL; InvalidRequestError names `retention_seconds` past a day."""
    if not 0 <= seconds <= MAX_RETENTION_SECONDS:
        raise InvalidRequestError(
            "retention_seconds", f"{seconds} s is outside [0, {MAX_RETENTION_SECONDS}]"
        )
    return int(seconds)


def branch_hints_of(hints: Sequence[int], prompt_len: int) -> tuple[int, ...]:
    """A request's branch hints, each a position inside its prompt; InvalidRequestError names
    `branch_hints` otherwise."""
    if len(hints) > MAX_BRANCH_HINTS:
        raise InvalidRequestError(
            "branch_hints", f"{len(hints)} positions > limit {MAX_BRANCH_HINTS}"
        )
    outside = [hint for hint in hints if not 0 < hint <= prompt_len]
    if outside:
        raise InvalidRequestError(
            "branch_hints", f"{outside} lie outside the {prompt_len}-token prompt [1, {prompt_len}]"
        )
    return tuple(int(hint) for hint in hints)
