"""What the load driver drives, and the registry that opens one from a `--target` spec.

A target serves `generate(conversation_id, tokens, max_tokens)`; turns of one conversation share
the id so that a router can keep them on one rank. Factories are registered per scheme: `http`
(OpenAI completions), `grpc` (the router's Generate stream) and `sim` (a simulated fleet).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .records import Generation


class Clock(Protocol):
    """The time a target's generations are stamped with, and the driver's pacing waits."""

    def now(self) -> float:
        """Seconds on this clock."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` on this clock."""
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


class Target(Protocol):
    """Something that generates completions for token prompts."""

    clock: Clock

    async def generate(
        self, conversation_id: str, tokens: list[int], max_tokens: int
    ) -> Generation:
        """Generate `max_tokens` tokens after `tokens`; raise TargetError on failure."""
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


TargetFactory = Callable[[str, TargetOptions], Target]


def _open_http(spec: str, options: TargetOptions) -> Target:
    from .http_target import OpenAICompletionsTarget

    return OpenAICompletionsTarget(spec, model=options.model, timeout_s=options.request_timeout_s)


def _open_grpc(spec: str, options: TargetOptions) -> Target:
    from .grpc_target import RouterGenerateTarget

    return RouterGenerateTarget(spec, timeout_s=options.request_timeout_s)


def _open_sim(spec: str, options: TargetOptions) -> Target:
    from .sim_config import SimConfigError
    from .sim_target import open_sim_target

    try:
        return open_sim_target(spec, options)
    except (SimConfigError, OSError) as error:
        raise TargetUnavailable(f"target {spec!r}: {error}") from error


# Scheme -> factory. The scheme is what precedes "://" (or the whole spec, as in "sim").
TARGET_FACTORIES: dict[str, TargetFactory] = {
    "http": _open_http,
    "https": _open_http,
    "grpc": _open_grpc,
    "sim": _open_sim,
}


def target_scheme(spec: str) -> str:
    """The registry key of a spec: 'http' for 'http://h:p'; 'sim' for 'sim', 'sim:f', 'sim?k=v'."""
    if "://" in spec:
        return spec.split("://", 1)[0]
    return spec.split(":", 1)[0].split("?", 1)[0]


def open_target(spec: str, options: TargetOptions | None = None) -> Target:
    """Open the target a spec names."""
    factory = TARGET_FACTORIES.get(target_scheme(spec))
    if factory is None:
        raise TargetUnavailable(
            f"target {spec!r}: unknown scheme {target_scheme(spec)!r}; known: "
            f"{sorted(TARGET_FACTORIES)}"
        )
    return factory(spec, options or TargetOptions())
