"""Reuse policies: which blocks a request commits and how many turns a conversation retains.

Chosen by name from `REUSE_POLICIES`; the manager asks the policy, never branches on its name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class AllReusable:
    """Commit every block of every reusable life cycle as it is computed; LRU decides the rest."""

    name = "all_reusable"
    commits_every_block = True
    allows_checkpoint = False
    retained_turns = 0
    recent_turns = 0
    keep_root = False


@dataclass(frozen=True)
class PerRequest:
    """Commit full blocks as computed and the endpoint window (and snapshots) at the prompt end."""

    name = "per_request"
    commits_every_block = False
    allows_checkpoint = True
    retained_turns = 0
    recent_turns = 0
    keep_root = False


@dataclass(frozen=True)
class PerConversation:
    """Like per_request; a conversation also holds the endpoints of its last `max_num_turns`.

    With `keep_root`, it also holds those of its first turn for as long as it lives, so a turn
    that goes back to the conversation's start (a context reset keeping the system prompt and
    tools) can resume at that turn's endpoint or checkpoint.
    """

    max_num_turns: int = 2
    keep_root: bool = False
    name = "per_conversation"
    commits_every_block = False
    allows_checkpoint = True

    def __post_init__(self) -> None:
        if self.max_num_turns < 1:
            raise ValueError(f"max_num_turns must be >= 1, got {self.max_num_turns}")

    @property
    def recent_turns(self) -> int:
        """The most recent turns whose endpoints a conversation keeps."""
        return self.max_num_turns

    @property
    def retained_turns(self) -> int:
        """Turns a conversation holds at most (the root included): what pool sizing counts."""
        return self.max_num_turns + int(self.keep_root)


ReusePolicy = AllReusable | PerRequest | PerConversation

REUSE_POLICIES: dict[str, Callable[..., ReusePolicy]] = {
    "all_reusable": AllReusable,
    "per_request": PerRequest,
    "per_conversation": PerConversation,
}


def make_reuse_policy(name: str, **params: int | bool) -> ReusePolicy:
    """The policy registered under `name`, built with `params` (e.g. max_num_turns=2)."""
    try:
        factory = REUSE_POLICIES[name]
    except KeyError:
        known = sorted(REUSE_POLICIES)
        raise ValueError(f"unknown reuse policy {name!r}; known: {known}") from None
    return factory(**params)
