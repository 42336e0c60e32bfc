"""Reader for Mooncake jsonl traces, with conversations rebuilt by inferred continuation.

A request R continues an earlier request P when R starts with `P.hash_ids[:-1]` and P itself
introduced new ids in that range (so a shared system prompt links nothing). Ids are chained, so
`P.hash_ids[:-1]` is named by its last id and its length. A conversation is one tree of
continuations; its turns are replayed in arrival order. `think_time_s` of a turn is its arrival
gap after the previous turn of its conversation (the trace has no service times).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .model import Conversation, Turn

SOURCE = "mooncake"
BLOCK_SIZE = 512


@dataclass(frozen=True, slots=True)
class MooncakeRequest:
    """One line of a Mooncake trace."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def read_mooncake_requests(path: Path) -> list[MooncakeRequest]:
    """Read every line of a Mooncake jsonl file, in file (arrival) order."""
    requests = []
    with open(path) as stream:
        for line in stream:
            if not line.strip():
                continue
            row = json.loads(line)
            requests.append(
                MooncakeRequest(
                    arrival_s=float(row["timestamp"]) / 1000.0,
                    input_tokens=int(row["input_length"]),
                    output_tokens=int(row["output_length"]),
                    hash_ids=tuple(row["hash_ids"]),
                )
            )
    return requests


def infer_parents(requests: list[MooncakeRequest]) -> list[int | None]:
    """Index of the request each request continues, or None for a conversation start."""
    seen: set[int] = set()
    # Last id of P.hash_ids[:-1] -> P, only for P that introduced new ids in that range.
    continuable: dict[int, int] = {}
    parents: list[int | None] = []
    for index, request in enumerate(requests):
        ids = request.hash_ids
        parents.append(_longest_parent(ids, requests, continuable))
        if len(ids) >= 2 and ids[-2] not in continuable and not seen.issuperset(ids[:-1]):
            continuable[ids[-2]] = index
        seen.update(ids)
    return parents


def _longest_parent(
    ids: tuple[int, ...], requests: list[MooncakeRequest], continuable: dict[int, int]
) -> int | None:
    for position in range(len(ids) - 1, -1, -1):
        candidate = continuable.get(ids[position])
        if candidate is None:
            continue
        parent_ids = requests[candidate].hash_ids
        if len(parent_ids) - 2 == position and ids[: position + 1] == parent_ids[:-1]:
            return candidate
    return None


def read_mooncake(path: Path) -> list[Conversation]:
    """Read a Mooncake trace into conversations, ordered by their first arrival."""
    requests = read_mooncake_requests(path)
    parents = infer_parents(requests)
    roots: list[int] = []
    members: dict[int, list[int]] = {}
    root_of: list[int] = []
    for index, parent in enumerate(parents):
        root = index if parent is None else root_of[parent]
        root_of.append(root)
        if parent is None:
            roots.append(index)
            members[index] = []
        members[root].append(index)
    namespace = f"{SOURCE}/{path.stem}"
    return [
        _conversation(f"{namespace}/{root}", namespace, [requests[i] for i in members[root]])
        for root in roots
    ]


def _conversation(
    conversation_id: str, namespace: str, chain: list[MooncakeRequest]
) -> Conversation:
    turns = []
    previous_arrival = chain[0].arrival_s
    for index, request in enumerate(chain):
        turns.append(
            Turn(
                index=index,
                arrival_s=request.arrival_s,
                think_time_s=request.arrival_s - previous_arrival,
                input_tokens=request.input_tokens,
                output_tokens=request.output_tokens,
                hash_ids=request.hash_ids,
                namespace=namespace,
                block_size=BLOCK_SIZE,
            )
        )
        previous_arrival = request.arrival_s
    return Conversation(conversation_id=conversation_id, source=SOURCE, steps=tuple(turns))
