"""What a replay records per request, and what a target returns per generation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Generation:
    """One finished generation as a target saw it; times are on the target's clock."""

    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    first_token_s: float | None
    token_times_s: tuple[float, ...]
    finish_s: float
    rank: str | None = None  # where the fleet placed it, when the target says


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One replayed request; times are seconds since the run started.

    `token_times_s` holds the arrival time of every streamed output chunk, the first included,
    so inter-token latency is the gap between neighbours. `error` is set when the request
    failed; failed records carry no tokens and count in no measure. `rank`: the rank that
    served it, where the target names it (a kvfleet router's `x-kvfleet-rank`, the simulator).
    """

    conversation_id: str
    turn_index: int
    prompt_tokens: int
    reused_tokens: int
    output_tokens: int
    arrival_s: float
    first_token_s: float | None
    token_times_s: tuple[float, ...]
    finish_s: float
    error: str | None = None
    rank: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.reused_tokens <= self.prompt_tokens:
            raise ValueError(
                f"{self.conversation_id} turn {self.turn_index}: reused_tokens="
                f"{self.reused_tokens} not in [0, prompt_tokens={self.prompt_tokens}]"
            )
        if self.finish_s < self.arrival_s:
            raise ValueError(
                f"{self.conversation_id} turn {self.turn_index}: finish_s={self.finish_s} "
                f"before arrival_s={self.arrival_s}"
            )

    @property
    def ok(self) -> bool:
        """True when the request finished without error."""
        return self.error is None

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, or None when no token came."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s
