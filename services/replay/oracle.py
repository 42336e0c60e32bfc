"""The oracle: prefix reuse with an infinite cache and perfect routing.

Requests are offered in arrival order. A request reuses the longest prefix of its blocks that
was already seen as a prefix chain (block i counts only if blocks 0..i were seen together as a
prefix earlier). The index is a trie over block keys, so it is exact even if two chains share a
key at different positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .model import Turn

# Fraction of a request's prompt under which it counts as reusing nothing.
NO_REUSE_FRACTION = 0.02


@dataclass(frozen=True, slots=True)
class OracleMatch:
    """What one request reuses under the oracle."""

    reused_blocks: int
    total_blocks: int
    reused_tokens: int
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class OracleSummary:
    """Oracle figures over a sequence of requests."""

    requests: int
    reused_blocks: int
    total_blocks: int
    reused_tokens: int
    prompt_tokens: int
    requests_under_2_percent: int

    def __add__(self, other: OracleSummary) -> OracleSummary:
        """Totals of two disjoint request sets (e.g. trace files whose ids never meet)."""
        return OracleSummary(
            requests=self.requests + other.requests,
            reused_blocks=self.reused_blocks + other.reused_blocks,
            total_blocks=self.total_blocks + other.total_blocks,
            reused_tokens=self.reused_tokens + other.reused_tokens,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            requests_under_2_percent=self.requests_under_2_percent + other.requests_under_2_percent,
        )

    @property
    def block_reuse(self) -> float:
        """Reused blocks / all prompt blocks (the traces README's figure)."""
        return self.reused_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def token_reuse(self) -> float:
        """Reused prompt tokens / all prompt tokens (comparable with measured prefix reuse)."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def share_under_2_percent(self) -> float:
        """Share of requests whose own block reuse is under 2 %."""
        return self.requests_under_2_percent / self.requests if self.requests else 0.0


class PrefixOracle:
    """An infinite prefix cache. `offer` is the only writer of the trie.

    Trie edges are keyed by (node, block id) inside one namespace; entering a namespace is an
    edge keyed by (node, namespace name), which holds no block. So ids of different namespaces
    never meet, and the walk hashes small int pairs (fast on 100k-token prompts).
    """

    def __init__(self) -> None:
        self._edges: dict[tuple[int, int | str], int] = {}
        self._blocks = 0

    def offer(self, turn: Turn) -> OracleMatch:
        """Match a request against everything offered before, then remember its blocks."""
        shared = turn.shared_prefix_blocks
        node, reused_shared, complete = self._walk(0, turn.shared_namespace, range(shared))
        reused = reused_shared
        if complete:
            node, reused_own, _ = self._walk(node, turn.namespace, turn.hash_ids[shared:])
            reused += reused_own
        return OracleMatch(
            reused_blocks=reused,
            total_blocks=len(turn.hash_ids),
            reused_tokens=min(reused * turn.block_size, turn.input_tokens),
            prompt_tokens=turn.input_tokens,
        )

    def _walk(self, node: int, namespace: str, ids: Sequence[int]) -> tuple[int, int, bool]:
        """Follow `ids` in `namespace` from `node`, adding what is missing.

        Returns the last node, how many blocks were already there, and whether all were.
        """
        if not ids:
            return node, 0, True
        edges = self._edges
        node = self._child(node, namespace)
        matched = 0
        for block_id in ids:
            child = edges.get((node, block_id))
            if child is None:
                break
            node = child
            matched += 1
        for block_id in ids[matched:]:
            node = self._child(node, block_id)
            self._blocks += 1
        return node, matched, matched == len(ids)

    def _child(self, node: int, label: int | str) -> int:
        child = self._edges.get((node, label))
        if child is None:
            child = len(self._edges) + 1
            self._edges[(node, label)] = child
        return child

    @property
    def unique_blocks(self) -> int:
        """Distinct prefix chains seen so far (the infinite cache's working set in blocks)."""
        return self._blocks


def summarise(turns: Iterable[Turn], oracle: PrefixOracle | None = None) -> OracleSummary:
    """Offer turns in the given (arrival) order to an oracle and total the matches."""
    oracle = oracle or PrefixOracle()
    requests = reused_blocks = total_blocks = reused_tokens = prompt_tokens = under = 0
    for turn in turns:
        match = oracle.offer(turn)
        requests += 1
        reused_blocks += match.reused_blocks
        total_blocks += match.total_blocks
        reused_tokens += match.reused_tokens
        prompt_tokens += match.prompt_tokens
        if match.reused_blocks < NO_REUSE_FRACTION * match.total_blocks or not match.total_blocks:
            under += 1
    return OracleSummary(
        requests=requests,
        reused_blocks=reused_blocks,
        total_blocks=total_blocks,
        reused_tokens=reused_tokens,
        prompt_tokens=prompt_tokens,
        requests_under_2_percent=under,
    )
