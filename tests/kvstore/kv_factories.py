"""Small real managers and scripted turns for the kvstore tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from kvfleet.kvstore.config import CHECKPOINT_MARGIN_TOKENS, KVStoreConfig
from kvfleet.kvstore.events import KVEvent
from kvfleet.kvstore.life_cycles import FullLifeCycle, LifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import PerRequest, ReusePolicy
from kvfleet.kvstore.results import PrefixMatch


def make_manager(
    life_cycles: Sequence[LifeCycle] = (FullLifeCycle("full"),),
    pages: int | dict[str, int] = 16,
    block_size: int = 4,
    policy: ReusePolicy | None = None,
    checkpoint: bool = True,
    events: list[KVEvent] | None = None,
    checkpoint_margin_tokens: int = CHECKPOINT_MARGIN_TOKENS,
) -> KVCacheManager:
    """A manager with `pages` per pool (null page included) that appends events to `events`."""
    pool_pages = pages if isinstance(pages, dict) else {lc.name: pages for lc in life_cycles}
    config = KVStoreConfig(
        block_size=block_size,
        life_cycles=tuple(life_cycles),
        pool_pages=pool_pages,
        reuse_policy=policy or PerRequest(),
        checkpoint=checkpoint,
        checkpoint_margin_tokens=checkpoint_margin_tokens,
    )
    listener = events.append if events is not None else (lambda event: None)
    return KVCacheManager(config, listener)


def tokens(seed: int, count: int) -> list[int]:
    """`count` token ids that differ from any other seed's (same seed, same ids)."""
    return np.random.default_rng(seed).integers(0, 50_000, count).tolist()


def run_turn(
    manager: KVCacheManager,
    request_id: str,
    prompt: Sequence[int],
    conversation_id: str | None = None,
    chunk: int | None = None,
    finish: bool = True,
    branch_hints: Sequence[int] = (),
) -> PrefixMatch:
    """Add, admit and prefill `prompt` in chunks, finish its context (and request); the match."""
    manager.add_request(request_id, prompt, conversation_id, branch_hints=branch_hints)
    match = manager.match(request_id)
    remaining = len(prompt) - match.num_reusable_tokens
    step = chunk or remaining
    manager.admit(request_id, min(step, remaining))
    done = match.num_reusable_tokens
    while True:
        done = min(len(prompt), done + step)
        manager.commit(request_id, done)
        if done == len(prompt):
            break
        manager.allocate(request_id, min(step, len(prompt) - done))
    manager.finish_context(request_id)
    if finish:
        manager.finish_request(request_id)
    return match
