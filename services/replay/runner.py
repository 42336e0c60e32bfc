"""One replay arm end to end: drive a target, then measure against the oracle of what ran."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .driver import DriverOptions, LoadDriver, RecordSink
from .measures import ReplayMeasures, compute_measures
from .model import Conversation, Turn
from .oracle import summarise
from .records import RequestRecord
from .target_types import Target
from .tokens import TokenSynthesizer


@dataclass(frozen=True)
class ArmResult:
    """The records and measures of one arm."""

    name: str
    records: list[RequestRecord]
    measures: ReplayMeasures

    @property
    def errors(self) -> list[RequestRecord]:
        """Records of failed requests."""
        return [r for r in self.records if not r.ok]


def turn_index(conversations: Iterable[Conversation]) -> dict[tuple[str, int], Turn]:
    """(conversation id, turn index) -> turn, sub-agents included."""
    return {
        (conversation.conversation_id, turn.index): turn
        for root in conversations
        for conversation in root.all_conversations()
        for turn in conversation.turns()
    }


def oracle_reuse(records: Iterable[RequestRecord], turns: dict[tuple[str, int], Turn]) -> float:
    """Token-weighted oracle reuse of the successful records, offered in their arrival order."""
    done = sorted((r for r in records if r.ok), key=lambda r: r.arrival_s)
    return summarise(turns[(r.conversation_id, r.turn_index)] for r in done).token_reuse


async def run_arm(
    name: str,
    target: Target,
    conversations: Sequence[Conversation],
    synthesizer: TokenSynthesizer,
    options: DriverOptions,
    config: dict[str, Any],
    on_record: RecordSink | None = None,
) -> ArmResult:
    """Replay the conversations against the target and measure the run."""
    records = await LoadDriver(target, synthesizer, options, on_record).run(conversations)
    oracle = oracle_reuse(records, turn_index(conversations))
    return ArmResult(name=name, records=records, measures=compute_measures(records, oracle, config))
