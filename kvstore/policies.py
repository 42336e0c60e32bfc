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
    keep_branch_points = 0
    discover_branch_points = False


@dataclass(frozen=True)
class PerRequest:
    """Commit full blocks as computed and the endpoint window (and snapshots) at the prompt end."""

    name = "per_request"
    commits_every_block = False
    allows_checkpoint = True
    retained_turns = 0
    recent_turns = 0
    keep_root = False
    keep_branch_points = 0
    discover_branch_points = False


@dataclass(frozen=True)
class PerConversation:
    """Like per_request; a conversation also holds the endpoints of its last `max_num_turns`.

    With `keep_root`, it also holds those of its first turn for as long as it lives, so a turn
    that goes back to the conversation's start (a context reset keeping the system prompt and
    tools) can resume at that turn's endpoint or checkpoint.

    With `keep_branch_points` (how many; True is one), a turn whose whole-prefix match runs past
    where its windows can resume commits the window ending at that branch point, and the
    conversation holds it for as long as it lives (`kvfleet.kvstore.branch_points`), so a
    later turn that branches there again resumes at it. `discover_branch_points` False plans
    branch points only where a request hints them.
    """

    max_num_turns: int = 2
    keep_root: bool = False
    keep_branch_points: int = 0
    discover_branch_points: bool = True
    name = "per_conversation"
    commits_every_block = False
    allows_checkpoint = True

    def __post_init__(self) -> None:
        if self.max_num_turns < 1:
            raise ValueError(f"max_num_turns must be >= 1, got {self.max_num_turns}")
        if self.keep_branch_points < 0:
            raise ValueError(f"keep_branch_points must be >= 0, got {self.keep_branch_points}")

    @property
    def recent_turns(self) -> int:
        """The most recent turns whose endpoints a conversation keeps."""
        return self.max_num_turns

    @property
    def retained_turns(self) -> int:
        """Turns a conversation holds at most (root and branch endpoints included): what pool
        sizing counts (a branch endpoint holds less than a turn, so this is an upper bound)."""
        return self.max_num_turns + int(self.keep_root) + int(self.keep_branch_points)


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
