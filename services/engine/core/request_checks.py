"""Whether a request can run on this rank: the model's context and vocabulary, the batch, and
whether each KV pool could hold the request alone. Pure functions of the request and the
rank's fixed sizes; the engine core adds what only it knows (the requests running now).

Each refusal is an InvalidRequestError naming the field at fault first.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from ....kvstore.config import KVStoreConfig
from ....kvstore.sizing import TypicalStep, peak_demand
from ..request.engine_request import GenerateCall, InvalidRequestError

# Which pool cannot hold one request of `total` tokens alone, and by how much (None: all can).
Shortfall = Callable[[int], str | None]


@dataclass(frozen=True)
class RequestBounds:
    """The rank's limits a request is checked against."""

    max_position: int  # the model's context (prompt + output)
    vocab_size: int
    max_batch_size: int  # samples of one request at most


def check_request(
    call: GenerateCall,
    bounds: RequestBounds,
    shortfall: Shortfall,
    running: Container[str] = (),
) -> None:
    """Raise InvalidRequestError naming the field when `call` cannot run within `bounds`, or
    its id is one of the `running` requests'."""
    prompt_len = len(call.prompt_token_ids)
    if prompt_len == 0:
        raise InvalidRequestError("prompt", "empty prompt")
    if prompt_len >= bounds.max_position:
        raise InvalidRequestError(
            "prompt",
            f"{prompt_len} tokens leave no room in the model's context of "
            f"{bounds.max_position} tokens",
        )
    total = prompt_len + call.sampling.max_tokens
    if total > bounds.max_position:
        raise InvalidRequestError(
            "max_tokens",
            f"prompt {prompt_len} + max_tokens {call.sampling.max_tokens} = {total} > "
            f"model context {bounds.max_position}",
        )
    bad = [t for t in call.prompt_token_ids if not 0 <= t < bounds.vocab_size]
    if bad:
        raise InvalidRequestError(
            "prompt", f"token ids {bad[:5]} outside 0..{bounds.vocab_size - 1}"
        )
    if not 1 <= call.num_samples <= bounds.max_batch_size:
        raise InvalidRequestError(
            "num_samples",
            f"{call.num_samples} not in 1..max_batch_size {bounds.max_batch_size}",
        )
    short = shortfall(total)
    if short is not None:
        raise InvalidRequestError("prompt", f"{total} tokens need {short}")
    if call.request_id in running:
        raise InvalidRequestError("request_id", f"{call.request_id!r} is already running")
    if (call.grammar is None) != (not call.sampling.grammar):  # one without the other
        raise InvalidRequestError("sampling.grammar", "a grammar comes with its compiled form")


def pool_shortfall(
    total: int,
    store: KVStoreConfig,
    usable_pages: Mapping[str, int],
    step_tokens: int,
    checkpoint: bool,
) -> str | None:
    """Which pool (of `usable_pages` each) cannot hold one request of `total` tokens alone,
    chunked `step_tokens` a step (None: all can)."""
    # NOTE: what one request holds per pool at its peak, by the same rule pool sizing uses: a
    # window pool holds the window plus a chunk (and checkpoints), not the whole sequence.
    alone = TypicalStep(
        1,
        total,
        step_tokens,
        checkpoint=checkpoint,
        every_block_snapshots=store.reuse_policy.commits_every_block,
    )
    need = peak_demand(alone, store.life_cycles, store.block_size)
    for name, usable in usable_pages.items():
        if need[name] > usable:
            return f"{need[name]} pages > pool {name!r} of {usable}"
    return None


def longest_request(max_position: int, shortfall: Shortfall) -> int:
    """The longest request (prompt + output) the pools hold: the model's context, or less."""
    low, high = 0, max_position
    while low < high:  # the pools' demand grows with the length: bisect the first refusal
        middle = (low + high + 1) // 2
        if shortfall(middle) is None:
            low = middle
        else:
            high = middle - 1
    return low
