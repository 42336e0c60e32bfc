"""Whether a sampled token ends its sample, and what the sample reports: pure functions the
engine core calls for each token it hands out.

| the token                                          | finish reason             |
|----------------------------------------------------|---------------------------|
| a stop token, or the output ends in a stop string  | `stop`                    |
| else the output reached `max_tokens`               | `length`                  |
| else the sample's grammar ended                    | `stop`                    |
| else                                               | none: the sample goes on  |
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..request.engine_request import SampleOutput, Usage
from ..request.sampling_params import SamplingParams, TokenLogprob
from ..request.sequence import Sequence as Sample


def finish_reason(
    token: int,
    output: Sequence[int],
    sampling: SamplingParams,
    stop_check: Callable[[Sequence[int]], bool] | None,
    grammar_ended: bool = False,
) -> str:
    """ "stop", "length" or "" (goes on) for a sample whose `output` now ends in `token`."""
    if sampling.is_stop(token) or (stop_check and stop_check(output)):
        return "stop"
    if len(output) >= sampling.max_tokens:
        return "length"
    return "stop" if grammar_ended else ""


def sample_usage(sample: Sample, block_size: int) -> Usage:
    """What a sample cost so far and how fast it ran."""
    steps = max(1, len(sample.output) - 1)
    cached = sample.cached_tokens or 0
    prompt = len(sample.prompt)
    return Usage(
        prompt_tokens=prompt,
        cached_tokens=cached,
        cache_write_tokens=max(0, prompt // block_size * block_size - cached),
        completion_tokens=len(sample.output),
        ttft_seconds=(sample.first_token_at or 0.0) - sample.arrived_at,
        mean_itl_seconds=sample.itl_total / steps,
    )


def token_output(
    sample: Sample,
    token: int,
    logprob: TokenLogprob | None,
    reason: str = "",
    usage: Usage | None = None,
) -> SampleOutput:
    """One token of a sample as its client gets it; finished when `reason` is set."""
    if not reason and logprob is None:
        return SampleOutput.one_token(sample.call.request_id, sample.sample_index, token)
    return SampleOutput(
        sample.call.request_id,
        sample.sample_index,
        (token,),
        bool(reason),
        reason,
        usage,
        (logprob,) if logprob is not None else (),
    )
