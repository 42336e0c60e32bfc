"""Configuration of one KV cache manager."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .life_cycles import LifeCycle
from .policies import PerRequest, ReusePolicy

CHECKPOINT_MARGIN_TOKENS = 512


@dataclass(frozen=True)
class KVStoreConfig:
    """Block size, life cycles, pages per life cycle's pool, reuse policy, checkpoint on/off."""

    block_size: int
    life_cycles: tuple[LifeCycle, ...]
    pool_pages: Mapping[str, int]
    reuse_policy: ReusePolicy = field(default_factory=PerRequest)
    checkpoint: bool = True
    checkpoint_margin_tokens: int = CHECKPOINT_MARGIN_TOKENS

    def __post_init__(self) -> None:
        names = [life_cycle.name for life_cycle in self.life_cycles]
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if not names or len(set(names)) != len(names):
            raise ValueError(f"life cycle names must be unique and non-empty, got {names}")
        if set(names) != set(self.pool_pages):
            raise ValueError(f"pool_pages keys {sorted(self.pool_pages)} != life cycles {names}")

    @property
    def max_replay_tokens(self) -> int:
        """R: how far before the prompt end reuse must stop, over required reusable life cycles."""
        return max(
            (lc.replay_tokens for lc in self.life_cycles if lc.reusable and lc.required),
            default=0,
        )

    def checkpoint_position(self, prompt_len: int) -> int:
        """R + margin tokens before the prompt end, aligned down to a block (may be <= 0)."""
        position = prompt_len - self.max_replay_tokens - self.checkpoint_margin_tokens
        return max(0, position) // self.block_size * self.block_size
