"""Drop plans: which pages a retained turn gives up when it falls out of its conversation.

Rules: private life cycles are skipped (they never commit); a missing page of an optional life
cycle is skipped; a missing page of a required life cycle means no plan; a page someone else
holds (a live request, another retained turn) is released but never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .life_cycles import LifeCycle
from .results import DropPlan, TurnRecord


def build_drop_plan(
    turn: TurnRecord,
    life_cycles: Mapping[str, LifeCycle],
    ref_count: Callable[[str, int], int],
) -> DropPlan | None:
    """The plan for `turn`, or None when a required life cycle's page is missing.

    A turn holds each page once, so a page is dropped exactly when the turn is its only holder.

    `ref_count(life_cycle, page)` is the page's current holder count, the turn included. Pure:
    reads only; the manager applies the plan.
    """
    released: dict[str, tuple[int, ...]] = {}
    dropped: dict[str, tuple[int, ...]] = {}
    for name, pages in turn.pages.items():
        life_cycle = life_cycles[name]
        if not life_cycle.reusable:
            continue
        present = tuple(page for page in pages if page is not None)
        if len(present) != len(pages) and life_cycle.required:
            return None
        released[name] = present
        dropped[name] = tuple(page for page in present if ref_count(name, page) == 1)
    return DropPlan(turn.conversation_id, turn.request_id, released, dropped)
