"""Checks on a client's GenerateRequest; each failure names the field and the numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...proto import router_pb2
from .errors import InvalidRequest
from .model import RankSlots


@dataclass(frozen=True)
class RequestLimits:
    """What the router accepts."""

    max_tokens: int = 131_072
    max_prompt_tokens: int = 2_000_000
    max_prompt_chars: int = 16_000_000
    max_id_chars: int = 256


def validate(
    request: router_pb2.GenerateRequest, limits: RequestLimits, ranks: dict[str, RankSlots]
) -> None:
    """Raise InvalidRequest for the first broken rule."""
    _check_prompt(request, limits)
    if request.max_tokens < 1:
        raise InvalidRequest("max_tokens", f"{request.max_tokens} must be >= 1")
    if request.max_tokens > limits.max_tokens:
        raise InvalidRequest("max_tokens", f"{request.max_tokens} > limit {limits.max_tokens}")
    for name in ("request_id", "conversation_id"):
        if len(getattr(request, name)) > limits.max_id_chars:
            raise InvalidRequest(
                name, f"{len(getattr(request, name))} chars > {limits.max_id_chars}"
            )
    if "|" in request.request_id:
        raise InvalidRequest("request_id", "must not contain '|'")
    _check_sampling(request.sampling)
    _check_slots(request, ranks)


def _check_prompt(request: router_pb2.GenerateRequest, limits: RequestLimits) -> None:
    kind = request.WhichOneof("prompt")
    if kind == "prompt_token_ids":
        count = len(request.prompt_token_ids.ids)
        if count == 0:
            raise InvalidRequest("prompt_token_ids", "empty prompt")
        if count > limits.max_prompt_tokens:
            raise InvalidRequest(
                "prompt_token_ids", f"{count} tokens > limit {limits.max_prompt_tokens}"
            )
    elif kind == "prompt_text":
        count = len(request.prompt_text)
        if count == 0:
            raise InvalidRequest("prompt_text", "empty prompt")
        if count > limits.max_prompt_chars:
            raise InvalidRequest("prompt_text", f"{count} chars > limit {limits.max_prompt_chars}")
    else:
        raise InvalidRequest("prompt", "empty: set prompt_token_ids or prompt_text")


def _check_sampling(sampling) -> None:
    if not math.isfinite(sampling.temperature) or sampling.temperature < 0:
        raise InvalidRequest("sampling.temperature", f"{sampling.temperature} must be >= 0")
    if not math.isfinite(sampling.top_p) or not 0 <= sampling.top_p <= 1:
        raise InvalidRequest("sampling.top_p", f"{sampling.top_p} not in [0, 1]")


def _check_slots(request: router_pb2.GenerateRequest, ranks: dict[str, RankSlots]) -> None:
    slots = 1 + request.child_samples
    if request.HasField("rank_id"):
        rank = ranks.get(request.rank_id)
        if rank is None:
            raise InvalidRequest("rank_id", f"unknown rank {request.rank_id!r}")
        if slots > rank.info.max_batch_size and not request.relax_rank:
            raise InvalidRequest(
                "child_samples",
                f"request needs {slots} slots > rank {request.rank_id} max_batch_size "
                f"{rank.info.max_batch_size}",
            )
    # With no rank registered yet the request waits for one (startup), bounded by the queue.
    largest = max((rank.info.max_batch_size for rank in ranks.values()), default=slots)
    if slots > largest:
        raise InvalidRequest(
            "child_samples", f"request needs {slots} slots > largest rank max_batch_size {largest}"
        )
