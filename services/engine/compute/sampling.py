"""Turning logits into tokens on the batch: penalties, greedy, temperature, top-p, seeds.

Every accepted value is numerically safe: temperatures below SAMPLING_EPS are greedy, scaled
logits are float64 (finite float32 logits over a temperature >= 1e-5 stay finite), and a row
whose logits hold NaN or +inf comes back as a SampleFailure for that row alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import inf

import torch

from ..request.sampling_params import (
    SAMPLING_EPS,
    RowResult,
    SampledToken,
    SampleFailure,
    SamplingParams,
    TokenLogprob,
)

__all__ = [
    "NON_FINITE_LOGITS",
    "SAMPLING_EPS",
    "RowResult",
    "SampleFailure",
    "SampledToken",
    "SamplingParams",
    "apply_penalties",
    "make_generator",
    "sample_batch",
    "sample_token",
]

NON_FINITE_LOGITS = "the model's logits hold NaN or +inf for this sequence"


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator of the request's own: seeded when it asks for a seed."""
    generator = torch.Generator(device=device)
    if params.seed is not None:
        generator.manual_seed(params.seed)
    else:
        generator.seed()
    return generator


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from `logits [vocab]` under `params`; ValueError for non-finite logits."""
    result = sample_batch(logits[None], [params], [generator])[0]
    if isinstance(result, SampleFailure):
        raise ValueError(result.message)
    return result if isinstance(result, int) else result.token


def sample_batch(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    prompts: Sequence[Sequence[int]] | None = None,
    outputs: Sequence[Sequence[int]] | None = None,
) -> list[RowResult]:
    """One result per row of `logits [B, vocab]`, each row under its own request's params.

    `prompts` and `outputs` (the tokens so far, per row) feed the penalties. A row is an int,
    a SampledToken when it asked for logprobs, or a SampleFailure.
    """
    rows = logits.shape[0]
    if not len(params) == len(generators) == rows:
        raise ValueError(f"{rows} logit rows, {len(params)} params, {len(generators)} generators")
    raw = logits.float()
    broken = (torch.isnan(raw) | torch.isposinf(raw)).any(-1) | torch.isneginf(raw).all(-1)
    # Rows that need more than an argmax of the raw logits, processed together in float64.
    shaped = [i for i, p in enumerate(params) if p.penalized or not p.greedy]
    scores: dict[int, torch.Tensor] = {}
    if shaped:
        block = raw[shaped].double().nan_to_num(nan=float("-inf"))
        subset = [params[i] for i in shaped]
        if any(p.penalized for p in subset):
            block = apply_penalties(
                block,
                subset,
                [prompts[i] if prompts else () for i in shaped],
                [outputs[i] if outputs else () for i in shaped],
            )
        scores = dict(zip(shaped, block, strict=True))
    greedy = raw.argmax(-1).tolist()
    want_logprobs = [i for i, p in enumerate(params) if p.logprobs is not None]
    logprobs = torch.log_softmax(raw[want_logprobs].double(), -1) if want_logprobs else None
    bad = broken.tolist()
    results: list[RowResult] = []
    for i, p in enumerate(params):
        if bad[i]:
            results.append(SampleFailure(NON_FINITE_LOGITS))
            continue
        if i in scores:
            try:
                token = int(scores[i].argmax()) if p.greedy else _draw(scores[i], p, generators[i])
            except (RuntimeError, ValueError) as error:  # this row's params, not the batch's
                results.append(SampleFailure(f"sampling failed: {error}"))
                continue
        else:
            token = greedy[i]
        if logprobs is not None and p.logprobs is not None:
            results.append(
                SampledToken(token, _token_logprob(logprobs[want_logprobs.index(i)], token, p))
            )
        else:
            results.append(token)
    return results


def apply_penalties(
    scores: torch.Tensor,
    params: Sequence[SamplingParams],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Presence, frequency and repetition penalties on `scores [R, vocab]` (OpenAI/vLLM rules)."""
    rows, vocab = scores.shape
    device = scores.device
    counts = torch.zeros(rows, vocab, dtype=scores.dtype, device=device)
    in_prompt = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
    for row, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        if output:
            ids = torch.as_tensor(list(output), dtype=torch.long, device=device)
            counts[row].scatter_add_(0, ids, torch.ones_like(ids, dtype=scores.dtype))
        if prompt and params[row].repetition_penalty != 1.0:
            in_prompt[row, torch.as_tensor(list(prompt), dtype=torch.long, device=device)] = True
    column = {"dtype": scores.dtype, "device": device}
    repetition = torch.tensor([p.repetition_penalty for p in params], **column)[:, None]
    frequency = torch.tensor([p.frequency_penalty for p in params], **column)[:, None]
    presence = torch.tensor([p.presence_penalty for p in params], **column)[:, None]
    generated = counts > 0
    seen = generated | in_prompt
    repeated = torch.where(scores > 0, scores / repetition, scores * repetition)
    scores = torch.where(seen, repeated, scores)
    return scores - frequency * counts - presence * generated.to(scores.dtype)


def _draw(scores: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """A draw from softmax(scores / temperature), nucleus-cut to `top_p`."""
    probs = torch.softmax(scores / max(params.temperature, SAMPLING_EPS), dim=-1)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    if not bool(torch.isfinite(probs).all()) or not float(probs.sum()) > 0.0:
        raise ValueError(f"no finite distribution (temperature {params.temperature})")
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)  # the request's generator lives on the CPU
    return int(torch.multinomial(probs, 1, generator=generator))


def _token_logprob(row: torch.Tensor, token: int, params: SamplingParams) -> TokenLogprob:
    top: tuple[tuple[int, float], ...] = ()
    if params.logprobs:
        values, ids = row.topk(params.logprobs)
        # A grammar's refused tokens (-inf) are no alternatives.
        top = tuple((i, v) for i, v in zip(ids.tolist(), values.tolist(), strict=True) if v > -inf)
    return TokenLogprob(token, float(row[token]), top)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches `top_p` (at least one)."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)
