"""The engine core: one thread owns the kvstore manager, the scheduler and the model.

RPC and HTTP handlers never touch them: `submit` and `cancel` put commands on a queue that the
core thread runs between steps, and each request's outputs come back on a queue of its own
(`RequestHandle`). KV events are collected during a step and handed to `kv_event_sink` after it.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ....kvstore.events import KVEvent
from ....kvstore.manager import KVCacheManager
from ...disagg.roles import ROLE_HOOKS
from ..compute.backends import make_compute
from ..compute.compute_types import ComputeBackend
from ..config.engine_config import EngineConfig
from ..request.engine_request import (
    EngineLoad,
    EngineStoppedError,
    GenerateCall,
    InvalidRequestError,
    SampleOutput,
    SequenceFailedError,
    Usage,
)
from ..request.sampling_params import SampledToken, SampleFailure, TokenLogprob
from ..request.scheduled_chunk import ScheduledChunk
from ..request.sequence import Sequence
from .drain import DiskDrain
from .kv_events import BlockEvent, BlockTokens
from .lookahead import InflightStep, can_look_ahead, feed_rows, mark_pending, settle
from .metrics import EngineMetrics
from .prefetch_holds import PrefetchResult
from .request_checks import RequestBounds, check_request, longest_request, pool_shortfall
from .request_handle import RequestHandle
from .request_samples import samples_of
from .sample_finish import finish_reason, sample_usage, token_output
from .scheduler import Scheduler
from .step_log import StepLog

log = logging.getLogger(__name__)

IDLE_WAIT_SECONDS = 0.05
# A call run on the core thread (disagg reservations, integrity checks) waits this long for a
# busy core, checking every CORE_CALL_POLL_SECONDS whether the core stopped meanwhile.
CORE_CALL_TIMEOUT_SECONDS = 60.0
CORE_CALL_POLL_SECONDS = 0.2
MAX_HOLD_SECONDS = 3600.0  # a prefetch hold longer than this is a client's mistake
KVEventSink = Callable[[list[BlockEvent]], None]


class EngineCore:
    """Continuous batching over the kvstore manager and a compute backend, on one thread."""

    def __init__(
        self,
        config: EngineConfig,
        compute: ComputeBackend | None = None,
        metrics: EngineMetrics | None = None,
        kv_event_sink: KVEventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.compute = compute or make_compute(config)
        self.model_config = self.compute.model_config
        self.metrics = metrics or EngineMetrics()
        self.clock = clock
        self._sink = kv_event_sink
        self._events: list[KVEvent] = []
        # The compute backend allocates the device KV with its host and disk tiers.
        self.manager = KVCacheManager(
            self.compute.store_config, self._events.append, self.compute.open_tiers(), clock
        )
        # Stored events name their blocks' tokens from the kvstore's records (hashed once).
        self._block_tokens = BlockTokens(config.page_size, self.manager.sequence_hashes)
        follow = getattr(self.compute, "follow_page_tables", None)
        if follow is not None:  # decode steps read persistent device page tables
            follow(self.manager.watch_page_tables)
        self.metrics.tiers.watch(self.manager.tiers.metrics)
        self._step_log = (
            StepLog(config.step_log_path, self.manager.tiers.metrics)
            if config.step_log_path
            else None
        )
        # Scale-in: retained prefixes go to the shared disk while the rank drains (core thread).
        self.drain = DiskDrain(self.manager, self.metrics.drain_flushed_blocks)
        self._draining_mark = False  # the last mark handed to the core (set_draining's caller)
        self.scheduler = Scheduler(
            self.manager,
            config.max_batch_size,
            config.max_num_batched_tokens,
            config.onboard_pages_per_step,
        )
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._handles: dict[str, RequestHandle] = {}
        self._sequences: dict[str, list[Sequence]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        self._load = EngineLoad(config.max_batch_size, 0, 0, 0.0, 0)
        self._counted_preemptions = 0
        self._counted_released = 0
        self._counted_early = 0  # of them, inside a cache TTL
        self._inflight: InflightStep | None = None  # a decode step whose tokens are not read
        # What this rank's role does after a first token (context ranks park for a hand-off).
        self.role = ROLE_HOOKS[config.role](self)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> EngineCore:
        """Start the core thread."""
        self._thread = threading.Thread(target=self._run, name="engine-core", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the core thread; unfinished requests get EngineStoppedError."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.role.close()
        self.manager.tiers.close()  # the disk prefetch worker
        if self._step_log is not None and (self._thread is None or not self._thread.is_alive()):
            self._step_log.close()
        for handle in list(self._handles.values()):
            handle.put(EngineStoppedError(f"request {handle.call.request_id}: engine stopped"))
        self._handles.clear()

    @property
    def stopping(self) -> bool:
        """True once `stop` was called: errors from then on are the rank's, not a request's."""
        return self._stop.is_set()

    # -- what other threads call -------------------------------------------------------------------

    def submit(self, call: GenerateCall) -> RequestHandle:
        """Validate and queue a request; raises InvalidRequestError naming the field."""
        self.validate(call)
        handle = RequestHandle(call, self.cancel)
        self._commands.put(lambda: self._add(call, handle))
        return handle

    def cancel(self, request_id: str) -> None:
        """Drop a request wherever it is and release its pages."""
        self._commands.put(lambda: self._remove(request_id))

    def set_draining(self, draining: bool) -> None:
        """Take the pod's drain mark (any one thread, e.g. each heartbeat): on a change the core
        thread updates `drain`, flushing retained prefixes to the shared disk when it turns on."""
        if draining != self._draining_mark:
            self._draining_mark = draining
            self._commands.put(lambda: self.drain.set_draining(draining))

    def prefetch_conversation(
        self, conversation_id: str, hold_seconds: float, prompt: tuple[int, ...] = ()
    ) -> PrefetchResult:
        """Bring a conversation's blocks (of `prompt`, else its last prompt here) up to the
        device and hold them for its next turn (`prefetch_holds.py`); runs on the core thread."""
        if not conversation_id:
            raise InvalidRequestError("conversation_id", "empty: name the conversation")
        if not 0 < hold_seconds <= MAX_HOLD_SECONDS:
            raise InvalidRequestError(
                "hold_seconds", f"{hold_seconds} not in (0, {MAX_HOLD_SECONDS:g}]"
            )
        if len(prompt) > self.max_request_tokens():
            raise InvalidRequestError(
                "prompt_token_ids",
                f"{len(prompt)} tokens > {self.max_request_tokens()} this rank serves",
            )
        holds = self.scheduler.holds
        return self.call_on_core(lambda: holds.hold(conversation_id, prompt or None, hold_seconds))

    def call_on_core(
        self, fn: Callable[[], Any], timeout: float = CORE_CALL_TIMEOUT_SECONDS
    ) -> Any:
        """Run `fn` on the core thread between steps and return its result.

        Waits while the core is busy (a long step on a loaded host is not a failure); raises
        EngineStoppedError at once when the core stops, TimeoutError after `timeout` seconds.
        """
        done: queue.Queue[tuple[bool, Any]] = queue.Queue()

        def run() -> None:
            try:
                done.put((True, fn()))
            except Exception as error:  # handed back to the caller below
                done.put((False, error))

        self._commands.put(run)
        deadline = time.monotonic() + timeout
        while True:
            try:
                ok, value = done.get(timeout=CORE_CALL_POLL_SECONDS)
                break
            except queue.Empty:
                if self._stop.is_set():
                    raise EngineStoppedError("engine stopped before the call ran") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the engine core did not run a call in {timeout:g} s"
                    ) from None
        if not ok:
            raise value
        return value

    def check_integrity(self) -> None:
        """Run the kvstore integrity check on the core thread (raises IntegrityError)."""
        self.call_on_core(self.manager.check_integrity)

    def load(self) -> EngineLoad:
        """The load after the last step (slots, queue, KV usage, retained pages)."""
        return self._load

    def next_request_id(self) -> str:
        """A fresh request id for callers that have none."""
        return f"req-{next(self._ids)}-{int(time.time() * 1000)}"

    # -- validation --------------------------------------------------------------------------------

    def validate(self, call: GenerateCall) -> None:
        """Raise InvalidRequestError naming the field when the request cannot run here."""
        model = self.model_config
        bounds = RequestBounds(model.max_position, model.vocab_size, self.config.max_batch_size)
        check_request(call, bounds, self._pool_shortfall, self._handles)

    def _pool_shortfall(self, total: int) -> str | None:
        """Which pool cannot hold one request of `total` tokens alone (None: all can)."""
        usable = {name: pool.num_usable for name, pool in self.manager.pools.items()}
        return pool_shortfall(
            total,
            self.manager.config,
            usable,
            self.config.max_num_batched_tokens,
            self.config.checkpoint,
        )

    def max_request_tokens(self) -> int:
        """The longest request (prompt + output) that validates here: the model's context, or
        less where the pools cannot hold a whole context for one request (a default
        `max_tokens` must not ask for more)."""
        return longest_request(self.model_config.max_position, self._pool_shortfall)

    # -- the core thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self.run_once(block=not self.scheduler.num_sequences)

    def run_once(self, block: bool = False) -> None:
        """One turn of the core loop: queued commands, then a step if anything can run.

        The core thread calls it; a benchmark that never starts the thread may call it from
        one thread of its own instead (never both).
        """
        try:
            if self._inflight is not None and not self._look_ahead():
                self._resolve()
            if self._inflight is None:  # commands never run while a step is in flight
                self._run_commands(block=block)
            planning = time.perf_counter()
            chunks = self.scheduler.schedule()
            if chunks:
                if self._step_log is not None:
                    waiting, planned = len(self.scheduler.waiting), time.perf_counter() - planning
                    self._step_log.before(chunks, waiting, self._inflight is not None, planned)
                started = time.perf_counter()
                self._step(chunks)
                # NOTE: with overlapped decode this is the wait for the previous step's tokens
                # plus this step's launch: one step's time in a steady batch.
                seconds = time.perf_counter() - started
                self.metrics.observe_step(chunks, seconds)
                if self._step_log is not None:
                    self._step_log.after(seconds)
            elif self._inflight is not None:
                self._resolve()
            self.role.tick()
            self._flush_events()
            self._publish_load()
        except Exception as error:  # a broken step must not leave clients waiting forever
            log.exception("engine step failed")
            self._inflight = None
            self._fail_all(error)

    def _run_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=IDLE_WAIT_SECONDS) if block else None
            while True:
                if command is not None:
                    command()
                command = self._commands.get_nowait()
        except queue.Empty:
            return

    def _add(self, call: GenerateCall, handle: RequestHandle) -> None:
        if call.request_id in self._handles:
            handle.put(InvalidRequestError("request_id", f"{call.request_id!r} is running"))
            return
        sequences = samples_of(call, self.clock())
        for sequence in sequences:
            self.scheduler.add(sequence)
            self._block_tokens.extend(sequence.key, call.prompt_token_ids, call.extra_key)
        self._handles[call.request_id] = handle
        self._sequences[call.request_id] = sequences

    # -- hand-off (core thread; see kvfleet.services.disagg) ----------------------------------

    def new_sequence(self, call: GenerateCall) -> Sequence:
        """A single-sample sequence for `call`, not yet known to the scheduler."""
        return samples_of(call, self.clock(), count=1)[0]

    def detach(self, request_id: str) -> RequestHandle:
        """Forget a request but keep its pages (its KV is handed off); returns its handle."""
        for sequence in self._sequences.pop(request_id):
            sequence.finished = True
            self.scheduler.park(sequence)
            self._block_tokens.retire(sequence.key)
        return self._handles.pop(request_id)

    def adopt(self, sequence: Sequence, reused_tokens: int, tokens: tuple[int, ...]):
        """Run a sequence whose prompt KV was installed (admitted, computed) as decoding after
        `tokens` already sampled elsewhere; returns its RequestHandle."""
        call = sequence.call
        if call.request_id in self._handles:
            raise InvalidRequestError("request_id", f"{call.request_id!r} is already running")
        now = self.clock()
        for token in tokens if sequence.grammar else ():  # sampled under the same grammar
            problem = sequence.grammar.accept(token)
            if problem:
                raise InvalidRequestError("sampling.grammar", problem)
        sequence.admitted = True
        sequence.cached_tokens = reused_tokens
        sequence.output.extend(tokens)
        sequence.first_token_at = sequence.last_token_at = now
        self.manager.append_tokens(sequence.key, tokens)
        self._block_tokens.extend(sequence.key, [*call.prompt_token_ids, *tokens], call.extra_key)
        self.scheduler.adopt(sequence)
        self.scheduler.context_ended(sequence)
        self.drain.context_ended(sequence.conversation_id)
        handle = RequestHandle(call, self.cancel)
        self._handles[call.request_id] = handle
        self._sequences[call.request_id] = [sequence]
        return handle

    def usage_of(self, sequence: Sequence) -> Usage:
        """What a sample cost so far (the hand-off reports it with the first token)."""
        return self._usage(sequence)

    def _remove(self, request_id: str) -> None:
        for sequence in self._sequences.pop(request_id, []):
            if not sequence.finished:
                sequence.finished = True
                self.scheduler.remove(sequence)
            self._block_tokens.retire(sequence.key)
        self._handles.pop(request_id, None)

    def _step(self, chunks: list[ScheduledChunk]) -> None:
        launch = getattr(self.compute, "launch", None)
        if self._inflight is not None and not self.compute.takes_feed(chunks):
            # planned ahead with an admission's prefill: its tokens first, then the plan's inputs
            self._resolve()
            chunks = settle(chunks)
            if not chunks:  # every sequence planned ended on its token (a failed request)
                return
        if launch is not None:
            ahead = self._inflight
            feed = None if ahead is None else (ahead.device_tokens, feed_rows(chunks, ahead))
            finish = launch(chunks, feed) if feed is not None else launch(chunks)
        else:
            finish = functools.partial(lambda tokens: tokens, self.compute.execute(chunks))
        # Commits need no token values: they run while the device computes the step.
        self._commit(chunks)
        if self._inflight is not None:
            self._resolve()  # the previous step's tokens, while this one runs
        if self.config.overlap_decode and getattr(finish, "device_tokens", None) is not None:
            self._inflight = mark_pending(chunks, finish)
            return
        tokens = finish()
        now = self.clock()
        rows = [(c.sequence, t, None) for c, t in zip(chunks, tokens, strict=True)]
        if self._emit_step(rows, now):
            return
        for chunk, token in zip(chunks, tokens, strict=True):
            sequence = chunk.sequence
            if sequence.finished:  # a sibling sample failed earlier in this step
                continue
            if isinstance(token, SampleFailure):  # this request fails alone; the batch goes on
                self._fail_request(sequence.call.request_id, token.message)
            elif isinstance(token, SampledToken):
                self._emit(sequence, token.token, now, token.logprobs)
            elif token is not None:
                self._emit(sequence, token, now)

    def _commit(self, chunks: list[ScheduledChunk]) -> None:
        """Record the step's computed tokens; a step that ends no context commits in one
        kvstore call."""
        live = [chunk for chunk in chunks if not chunk.sequence.finished]
        keys, counts = [], []
        for chunk in live:
            sequence = chunk.sequence
            if not sequence.context_done:
                break
            keys.append(sequence.key)
            counts.append(chunk.start + len(chunk.new_tokens))
        else:
            self.manager.commit_all(keys, counts)
            return
        for chunk in live:
            sequence = chunk.sequence
            self.manager.commit(sequence.key, chunk.start + len(chunk.new_tokens))
            if not sequence.context_done and chunk.samples:
                self.scheduler.context_ended(sequence)
                self.drain.context_ended(sequence.conversation_id)

    def _look_ahead(self) -> bool:
        waiting = not self._commands.empty()
        return can_look_ahead(self._inflight, self.scheduler, self.manager, waiting)

    def _resolve(self) -> None:
        """Read the step in flight's tokens and emit them."""
        inflight, self._inflight = self._inflight, None
        tokens = inflight.finish()
        now = self.clock()
        rows = [
            (chunk.sequence, token, index)
            for chunk, token, index in zip(inflight.chunks, tokens, inflight.indices, strict=True)
            if index is not None
        ]
        if self._emit_step(rows, now):
            return
        for chunk, token, index in zip(inflight.chunks, tokens, inflight.indices, strict=True):
            sequence = chunk.sequence
            if index is None or sequence.finished:
                continue
            if isinstance(token, SampleFailure):
                del sequence.output[index:]
                self._fail_request(sequence.call.request_id, token.message)
            elif token is not None:
                self._emit(sequence, token, now, index=index)

    def _emit_step(self, step: list[tuple[Sequence, Any, int | None]], now: float) -> bool:
        """Hand out a step's tokens (`(sequence, token, index)` rows, `_emit`'s arguments) as
        `_emit` does one by one, with the kvstore, the block tracker and the gap histograms
        called once for the step. Only where no row can end another's request: every token a
        plain id, no grammar, no first token (a hand-off may take its request); otherwise
        False, and nothing was done. A finished sequence, or a row with no token, is skipped
        as `_emit`'s callers skip it.
        """
        rows = []
        for sequence, token, index in step:
            if token is None or sequence.finished:
                continue
            if (
                type(token) is not int
                or sequence.grammar is not None
                or sequence.first_token_at is None
            ):
                return False
            rows.append((sequence, token, index))
        if not rows:
            return True
        keys = [sequence.key for sequence, _, _ in rows]
        picked = [token for _, token, _ in rows]
        self.manager.append_tokens_all(keys, picked)
        self._block_tokens.extend_all(keys, picked)
        gaps: dict[float, int] = {}
        handles = self._handles
        for sequence, token, index in rows:
            if index is None:
                sequence.output.append(token)
            else:
                sequence.output[index] = token
            gap = now - (sequence.last_token_at or now)
            gaps[gap] = gaps.get(gap, 0) + 1
            sequence.itl_total += gap
            sequence.last_token_at = now
            call = sequence.call
            reason = finish_reason(token, sequence.output, sequence.sampling, call.stop_check)
            if reason:
                self._finish_sample(sequence, token, None, reason)
                continue
            output = SampleOutput.one_token(call.request_id, sequence.sample_index, token)
            if not self.role.after_first_token(sequence, output):
                handles[call.request_id].put(output)
        self.metrics.token_gaps(gaps)
        return True

    def _emit(
        self,
        sequence: Sequence,
        token: int,
        now: float,
        logprob: TokenLogprob | None = None,
        index: int | None = None,
    ) -> None:
        """Hand out one sampled token; `index`: it replaces that PENDING one of the output."""
        self.manager.append_tokens(sequence.key, [token])
        self._block_tokens.extend(sequence.key, [token])
        if index is None:
            sequence.output.append(token)
        else:
            sequence.output[index] = token  # the last one: the next step is marked after this
        if sequence.first_token_at is None:
            sequence.first_token_at = now
            self.metrics.first_token(now - sequence.arrived_at)
        else:
            gap = now - (sequence.last_token_at or now)
            self.metrics.token_gap(gap)
            sequence.itl_total += gap
        sequence.last_token_at = now
        call = sequence.call
        grammar_ended = False
        if sequence.grammar is not None:
            problem = sequence.grammar.accept(token)
            if problem:  # only a backend that ignores masks (sim) gets here
                self._fail_request(call.request_id, problem)
                return
            grammar_ended = sequence.grammar.ended
        self._hand_out(sequence, token, logprob, grammar_ended)

    def _hand_out(
        self, sequence: Sequence, token: int, logprob: TokenLogprob | None, grammar_ended: bool
    ) -> None:
        """Queue a sample's token for its client, finishing the sample where it ends."""
        call = sequence.call
        reason = finish_reason(
            token, sequence.output, sequence.sampling, call.stop_check, grammar_ended
        )
        if not reason:
            output = token_output(sequence, token, logprob)
            if not self.role.after_first_token(sequence, output):
                self._handles[call.request_id].put(output)
            return
        self._finish_sample(sequence, token, logprob, reason)

    def _finish_sample(
        self, sequence: Sequence, token: int, logprob: TokenLogprob | None, reason: str
    ) -> None:
        """Hand out a sample's last token with its usage, and forget the sample."""
        call = sequence.call
        usage = self._usage(sequence)
        output = token_output(sequence, token, logprob, reason, usage)
        sequence.finished = True
        self.drain.turn_finished(sequence.key, sequence.conversation_id)
        self.scheduler.remove(sequence)
        self._block_tokens.retire(sequence.key)
        self.metrics.sample_finished(usage, reason)
        if all(s.finished for s in self._sequences[call.request_id]):
            self._sequences.pop(call.request_id)
            self._handles.pop(call.request_id).put(output)
            return
        self._handles[call.request_id].put(output)

    def _usage(self, sequence: Sequence) -> Usage:
        return sample_usage(sequence, self.config.page_size)

    def _flush_events(self) -> None:
        events = self._block_tokens.translate(self._events)
        self._events.clear()
        if self._sink is not None and events:
            self._sink(events)

    def _publish_load(self) -> None:
        pools = self.manager.pools.values()
        usable = sum(pool.num_usable for pool in pools) or 1
        in_use = sum(pool.num_in_use for pool in pools)
        retained = self.scheduler.retained_pages()
        self._load = EngineLoad(
            self.config.max_batch_size,
            len(self.scheduler.running),
            len(self.scheduler.waiting),
            in_use / usable,
            retained,
            usable,
        )
        self.metrics.load(self._load)
        self.metrics.preemptions.inc(self.scheduler.preemptions - self._counted_preemptions)
        self._counted_preemptions = self.scheduler.preemptions
        order = self.scheduler.retained
        self.metrics.retained_released.inc(order.released - self._counted_released)
        self.metrics.retained_released_early.inc(order.released_early - self._counted_early)
        self._counted_released, self._counted_early = order.released, order.released_early

    def _fail_request(self, request_id: str, reason: str) -> None:
        log.warning("request %s failed: %s", request_id, reason)
        handle = self._handles.get(request_id)
        if handle is not None:
            handle.put(SequenceFailedError(f"request {request_id}: {reason}"))
        self._remove(request_id)

    def _fail_all(self, error: BaseException) -> None:
        for request_id, handle in list(self._handles.items()):
            handle.put(EngineStoppedError(f"request {request_id}: engine step failed: {error}"))
            self._remove(request_id)
