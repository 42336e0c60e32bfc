"""The load driver: conversations as concurrent sessions against one target.

`sessions` session slots start at offsets `i * stagger_s`; each slot replays root conversations
from a shared queue, one after another. Within a conversation a turn is sent `think_time_s *
time_scale` after the previous turn finished (0: at once), and not before the sub-agents
spawned since that turn have finished. Sub-agents run as concurrent users, each starting its
trace delay (scaled) after the parent's previous turn. The driver only reads the workload; its
record list has one writer, `_send`. When the first `give_up_after` requests all fail (a wrong
target, prompts the model cannot take) it stops at once rather than pacing through the trace.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .model import Conversation, Turn
from .prompt_layout import PromptLayout, layout_of, shared_end
from .records import RequestRecord
from .target_types import Target, TargetError
from .tokens import TokenSynthesizer


@dataclass(frozen=True)
class DriverOptions:
    """How a workload is paced."""

    sessions: int = 8
    time_scale: float = 1.0
    stagger_s: float = 1.0
    give_up_after: int = 0  # failures before any success that stop the run; 0: never stop
    stop_s: float | None = None  # no turn is sent this long after the start (a measured window)

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions={self.sessions} must be >= 1")
        if self.give_up_after < 0:
            raise ValueError(f"give_up_after={self.give_up_after} must be >= 0")
        if self.stop_s is not None and self.stop_s <= 0:
            raise ValueError(f"stop_s={self.stop_s} must be > 0")
        if self.time_scale < 0 or self.stagger_s < 0:
            raise ValueError(
                f"time_scale={self.time_scale} and stagger_s={self.stagger_s} must be >= 0"
            )


RecordSink = Callable[[RequestRecord], None]


class AllRequestsFailed(RuntimeError):
    """The first requests of a run all failed; `last_error` is the latest one's message."""

    def __init__(self, failures: int, last_error: str) -> None:
        super().__init__(f"the first {failures} requests all failed; the last: {last_error}")
        self.failures = failures
        self.last_error = last_error


class LoadDriver:
    """Replays conversations against a target and collects one record per request."""

    def __init__(
        self,
        target: Target,
        synthesizer: TokenSynthesizer,
        options: DriverOptions,
        on_record: RecordSink | None = None,
    ) -> None:
        self.target = target
        self.synthesizer = synthesizer
        self.options = options
        self.on_record = on_record
        self._records: list[RequestRecord] = []
        self._start = 0.0
        self._succeeded = 0
        self._tasks: list[asyncio.Task[None]] = []  # sessions and sub-agents, to cancel

    async def run(self, conversations: Sequence[Conversation]) -> list[RequestRecord]:
        """Replay every conversation; returns the records in completion order.

        Raises AllRequestsFailed (the sessions cancelled) when the first requests all failed,
        and the clock's error when it stopped keeping time (a simulated fleet's event failed).
        """
        self._records = []
        self._succeeded = 0
        clock = self.target.clock
        self._start = clock.now()
        queue = deque(conversations)
        slots = min(self.options.sessions, len(queue))
        self._tasks = [asyncio.create_task(self._session(slot, queue)) for slot in range(slots)]
        sessions = asyncio.gather(*self._tasks[:slots])
        clock_failed = asyncio.ensure_future(clock.failed())
        try:
            await asyncio.wait((sessions, clock_failed), return_when=asyncio.FIRST_COMPLETED)
            if clock_failed.done():
                clock_failed.result()  # raises: the sessions would wait on it for ever
            await sessions
        except BaseException:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(sessions, *self._tasks, return_exceptions=True)
            raise
        finally:
            clock_failed.cancel()
        return list(self._records)

    async def _session(self, slot: int, queue: deque[Conversation]) -> None:
        clock = self.target.clock
        await clock.sleep(self._start + slot * self.options.stagger_s - clock.now())
        while queue and not self._stopped():
            await self._conversation(queue.popleft())

    def _stopped(self) -> bool:
        stop = self.options.stop_s
        return stop is not None and self.target.clock.now() - self._start >= stop

    async def _conversation(self, conversation: Conversation) -> None:
        clock = self.target.clock
        scale = self.options.time_scale
        previous_finish = clock.now()
        children: list[asyncio.Task[None]] = []
        shared_ends: list[int] = []  # of the turns sent so far: later turns' message starts
        for step in conversation.steps:
            if isinstance(step, Turn):
                due = previous_finish + step.think_time_s * scale
                if children:
                    await asyncio.gather(*children)
                    children = []
                await clock.sleep(due - clock.now())
                if self._stopped():
                    break
                layout = layout_of(step, shared_ends)
                await self._send(conversation.conversation_id, step, layout)
                shared_ends.append(shared_end(step))
                previous_finish = clock.now()
                continue
            for delay_s, child in step.children:
                start = previous_finish + delay_s * scale
                children.append(asyncio.create_task(self._child(child, start)))
                self._tasks.append(children[-1])
        if children:
            await asyncio.gather(*children)

    async def _child(self, conversation: Conversation, start: float) -> None:
        clock = self.target.clock
        await clock.sleep(start - clock.now())
        await self._conversation(conversation)

    async def _send(self, conversation_id: str, turn: Turn, layout: PromptLayout) -> None:
        clock = self.target.clock
        tokens = self.synthesizer.turn_tokens(conversation_id, turn)
        arrival = clock.now()
        try:
            generation = await self.target.generate(
                conversation_id, tokens, max(1, turn.output_tokens), turn.branch_hints, layout
            )
        except (TargetError, OSError, TimeoutError) as error:
            record = RequestRecord(
                conversation_id=conversation_id,
                turn_index=turn.index,
                prompt_tokens=turn.input_tokens,
                reused_tokens=0,
                output_tokens=0,
                arrival_s=arrival - self._start,
                first_token_s=None,
                token_times_s=(),
                finish_s=clock.now() - self._start,
                error=str(error) or type(error).__name__,
            )
        else:
            start = self._start
            record = RequestRecord(
                conversation_id=conversation_id,
                turn_index=turn.index,
                prompt_tokens=generation.prompt_tokens,
                reused_tokens=generation.cached_tokens,
                output_tokens=generation.output_tokens,
                arrival_s=arrival - start,
                first_token_s=(
                    None if generation.first_token_s is None else generation.first_token_s - start
                ),
                token_times_s=tuple(t - start for t in generation.token_times_s),
                finish_s=generation.finish_s - start,
                rank=generation.rank,
            )
        self._records.append(record)
        if self.on_record is not None:
            self.on_record(record)
        self._succeeded += record.ok
        failures = len(self._records) - self._succeeded
        if not self._succeeded and failures == self.options.give_up_after:
            raise AllRequestsFailed(failures, record.error or "")
