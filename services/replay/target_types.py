"""What the load driver drives: a target's interface, its clock, its errors and options.

The registry (`target.py`) and every target (`http_target.py`, `grpc_target.py`,
`sim_target.py`) import these; the registry imports the targets, never the other way round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .prompt_layout import PromptLayout
from .records import Generation


class Clock(Protocol):
    """The time a target's generations are stamped with, and the driver's pacing waits."""

    def now(self) -> float:
        """Seconds on this clock."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` on this clock."""
        ...

    async def failed(self) -> None:
        """Raise what broke this clock's timekeeping; never returns while it keeps time."""
        ...


class WallClock:
    """Real time (`time.perf_counter`)."""

    def now(self) -> float:
        """Seconds of `time.perf_counter`."""
        return time.perf_counter()

    async def sleep(self, seconds: float) -> None:
        """`asyncio.sleep`, skipping non-positive waits."""
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def failed(self) -> None:
        """Real time never breaks: wait until cancelled."""
        await asyncio.Event().wait()


@dataclass(frozen=True)
class TargetInfo:
    """What a target says of its model; None where it does not say."""

    vocab_size: int | None = None  # token ids sent must be below it
    max_model_len: int | None = None  # prompt + output tokens one request may have


class Target(Protocol):
    """Something that generates completions for token prompts."""

    clock: Clock

    async def describe(self) -> TargetInfo:
        """The model's vocabulary and context, as far as the target tells them."""
        ...

    async def generate(
        self,
        conversation_id: str,
        tokens: list[int],
        max_tokens: int,
        branch_hints: Sequence[int] = (),
        layout: PromptLayout | None = None,
    ) -> Generation:
        """Generate `max_tokens` tokens after `tokens` (`branch_hints`: prompt positions where
        later turns are likely to branch off; `layout`: where its tools, system prompt and
        messages begin, which only targets that send text chats read); raise TargetError on
        failure."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


class TargetError(RuntimeError):
    """A target failed one request."""


class TargetUnavailable(ValueError):
    """A `--target` spec names no target that can be opened here."""


@dataclass(frozen=True)
class TargetOptions:
    """Settings shared by every target kind."""

    model: str = "kvfleet"
    request_timeout_s: float = 600.0
    api: str = "completions"  # of an http target: completions, chat or anthropic (HTTP_APIS)
    anthropic_session: str = "metadata"  # how /v1/messages names the session (SESSION_SOURCES)


TargetFactory = Callable[[str, TargetOptions], Target]
