"""What an engine step computes, in the cost model's terms (`StepWork`), from its scheduled chunks
and the pages the KV tiers onboarded since the step before. The `sim` backend prices it; a step
log records it beside the step's measured time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ....kvstore.tiers.metrics import DISK, HOST
from ...core.cost_model import StepWork
from ..request.scheduled_chunk import ScheduledChunk


def step_work(chunks: Sequence[ScheduledChunk], host_pages: int, disk_pages: int) -> StepWork:
    """What a step computes: prompt chunks as prefill spans, decodes by their context length."""
    spans: list[tuple[int, int]] = []
    decodes: list[int] = []
    for chunk in chunks:
        end = chunk.start + len(chunk.new_tokens)
        if chunk.sequence.context_done:
            decodes.append(end)
        else:
            spans.append((chunk.start, end))
    return StepWork(tuple(spans), tuple(decodes), host_pages, disk_pages)


class OnboardedPages:
    """Host and disk pages onboarded since the last call, from the tiers' hit counters."""

    def __init__(self, tier_metrics: Mapping | None = None) -> None:
        self._metrics = tier_metrics
        self._seen = self._counts()

    def watch(self, tier_metrics: Mapping) -> None:
        """Count from these tiers on (a backend opens its tiers after it is built)."""
        self._metrics = tier_metrics
        self._seen = self._counts()

    def since_last(self) -> tuple[int, int]:
        """(host, disk) pages onboarded since the previous call."""
        now = self._counts()
        before, self._seen = self._seen, now
        return now[0] - before[0], now[1] - before[1]

    def _counts(self) -> tuple[int, int]:
        if self._metrics is None:
            return 0, 0
        return self._metrics[HOST].hits, self._metrics[DISK].hits
