"""Turning logits into tokens: greedy, temperature, top-p, a per-request seed, stop tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens; temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def is_stop(self, token: int) -> bool:
        """Whether generating `token` ends the request."""
        return token in self.stop_token_ids


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator of the request's own: seeded when it asks for a seed."""
    generator = torch.Generator(device=device)
    if params.seed is not None:
        generator.manual_seed(params.seed)
    else:
        generator.seed()
    return generator


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from `logits [vocab]` under `params`, drawing from `generator` only."""
    if params.greedy:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_batch(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> list[int]:
    """One token per row of `logits [B, vocab]`, each row under its own request's params."""
    if not len(params) == len(generators) == logits.shape[0]:
        raise ValueError(
            f"{logits.shape[0]} logit rows, {len(params)} params, {len(generators)} generators"
        )
    greedy = logits.argmax(dim=-1).tolist()
    return [
        greedy[i] if p.greedy else sample_token(logits[i], p, g)
        for i, (p, g) in enumerate(zip(params, generators, strict=True))
    ]


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches `top_p` (at least one)."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)
