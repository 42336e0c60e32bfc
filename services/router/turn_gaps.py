"""When a conversation's next turn is likely to come: a model of its own inter-turn gaps.

An agent's next turn arrives after a tool runs; how long that takes differs by conversation
(a test suite, a file read), so the model learns each conversation's gaps from that
conversation's history alone, never from fleet-wide or trace constants:

| history          | prefetch starts after the turn ends | the hold lasts until the turn ends + |
|------------------|-------------------------------------|--------------------------------------|
| no gap seen yet  | never (the turn's arrival triggers) | -                                    |
| gaps g1..gn      | min(recent gaps) / 2                | 2 x max(recent gaps)                 |

Starting at half the shortest gap leaves the other half for the copy up; a hold that outlives
twice the longest gap seen is given up (the conversation has likely paused or ended).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

RECENT_GAPS = 8  # gaps a conversation keeps: tool times drift as a session goes on


@dataclass(frozen=True)
class PrefetchWindow:
    """Seconds after a turn's end: when to start bringing its blocks up, when to give up."""

    start_after_s: float
    hold_for_s: float


class TurnGaps:
    """Per-conversation inter-turn gaps; the only writer of its history."""

    def __init__(self, recent: int = RECENT_GAPS) -> None:
        if recent < 1:
            raise ValueError(f"recent={recent} must be >= 1")
        self._recent = recent
        self._ended: dict[str, float] = {}
        self._gaps: dict[str, deque[float]] = {}

    def turn_ended(self, conversation_id: str, now: float) -> None:
        """A turn of the conversation finished at `now`."""
        self._ended[conversation_id] = now

    def turn_arrived(self, conversation_id: str, now: float) -> None:
        """A turn arrived at `now`: the gap since the last end joins the history."""
        ended = self._ended.pop(conversation_id, None)
        if ended is None:
            return
        gaps = self._gaps.setdefault(conversation_id, deque(maxlen=self._recent))
        gaps.append(max(0.0, now - ended))

    def forget(self, conversation_id: str) -> None:
        """The conversation was released: drop its history."""
        self._ended.pop(conversation_id, None)
        self._gaps.pop(conversation_id, None)

    def window(self, conversation_id: str) -> PrefetchWindow | None:
        """When to prefetch after the turn that just ended; None without a gap seen yet."""
        gaps = self._gaps.get(conversation_id)
        if not gaps:
            return None
        return PrefetchWindow(min(gaps) / 2, 2 * max(gaps))

    def __len__(self) -> int:
        return len(self._gaps)
