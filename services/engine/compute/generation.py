"""Generation for one sequence on its own pages, with no kvstore: demos, tests, benchmarks.

The serving engine takes page ids from the kvstore manager; this helper hands a lone sequence
the pages 1, 2, 3, ... of every group (page 0 is the cache's null page) and runs chunked
prefill then decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention.backends import AttentionBackend
from ..attention.batch import ForwardBatch, SequenceChunk
from ..kv.kv_cache import PagedKVCache
from ..model.decoder import CausalLM
from .sampling import SamplingParams, make_generator, sample_token


@dataclass(frozen=True)
class Generation:
    """Tokens a request produced and why it stopped (`stop` or `length`)."""

    token_ids: list[int]
    finish_reason: str


def lone_sequence_pages(cache: PagedKVCache, num_tokens: int) -> dict[str, list[int]]:
    """Pages 1..n of every group for one sequence of `num_tokens` tokens."""
    needed = -(-num_tokens // cache.page_size)
    for group, num_pages in cache.num_pages.items():
        if needed >= num_pages:
            raise ValueError(
                f"{num_tokens} tokens need {needed} pages; group {group!r} has {num_pages - 1}"
            )
    return {group: list(range(1, needed + 1)) for group in cache.num_pages}


def generate(
    model: CausalLM,
    cache: PagedKVCache,
    backend: AttentionBackend,
    prompt: list[int],
    params: SamplingParams,
    prefill_chunk: int = 512,
) -> Generation:
    """Prefill `prompt` in chunks of `prefill_chunk`, then decode up to `params.max_tokens`."""
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    pages = lone_sequence_pages(cache, len(prompt) + params.max_tokens)
    generator = make_generator(params, cache.device)
    logits = None
    for start in range(0, len(prompt), prefill_chunk):
        chunk = SequenceChunk(prompt[start : start + prefill_chunk], start, pages)
        logits = model(ForwardBatch.build([chunk], cache), cache, backend)
    out: list[int] = []
    while True:
        token = sample_token(logits[0], params, generator)
        out.append(token)
        if params.is_stop(token):
            return Generation(out, "stop")
        if len(out) == params.max_tokens:
            return Generation(out, "length")
        chunk = SequenceChunk([token], len(prompt) + len(out) - 1, pages)
        logits = model(ForwardBatch.build([chunk], cache), cache, backend)


def default_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 on GPU, fp32 on CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
