"""Small real engines for the serving tests: the tiny model on CPU, fp32, one thread."""

from __future__ import annotations

import dataclasses
import random
import threading
import time

from kvfleet.services.engine.compute.backends import TorchCompute
from kvfleet.services.engine.compute.sampling import SamplingParams
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.request.engine_request import (
    GenerateCall,
    SampleOutput,
    SequenceFailedError,
)

# Small pools and a small step budget, so chunked prefill and paging are exercised; a short
# checkpoint margin so that short prompts that rewrite their tail still reuse a prefix.
TEST_CONFIG = EngineConfig(
    model="tiny",
    max_batch_size=4,
    max_num_batched_tokens=48,
    page_size=16,
    kv_pages=160,
    checkpoint_margin_tokens=32,
)

_COMPUTE: dict[tuple[EngineConfig, str], TorchCompute] = {}


def shared_compute(config: EngineConfig = TEST_CONFIG, storage: str = "main") -> TorchCompute:
    """One model + KV storage per (config, storage name) for the session (building costs ~1 s).

    Two live cores must not share a storage name: each manager hands out the same page ids.
    """
    if (config, storage) not in _COMPUTE:
        _COMPUTE[config, storage] = TorchCompute(config)
    return _COMPUTE[config, storage]


def make_core(config: EngineConfig = TEST_CONFIG, storage: str = "main", **kwargs) -> EngineCore:
    """A started core with a fresh manager (an empty prefix cache) over a session model."""
    return EngineCore(config, compute=shared_compute(config, storage), **kwargs).start()


def greedy(max_tokens: int = 8, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)


def two_turns(seed: int, tag: str) -> tuple[GenerateCall, list[int]]:
    """Turn 1 of conversation `{tag}{seed}` and the tokens its turn 2 appends after turn 1's
    output (150-token prompt, 37 appended, greedy 8)."""
    rng = random.Random(seed)
    prompt = tuple(rng.randrange(256) for _ in range(150))
    appended = [rng.randrange(256) for _ in range(37)]
    return GenerateCall(f"{tag}{seed}-t1", prompt, greedy(8), f"{tag}{seed}"), appended


def turn_two(first: GenerateCall, output: list[int], appended: list[int]) -> GenerateCall:
    """The turn that resends turn 1's prompt and output, then `appended`."""
    prompt = (*first.prompt_token_ids, *output, *appended)
    return GenerateCall(f"{first.conversation_id}-t2", prompt, greedy(8), first.conversation_id)


def run_call(core: EngineCore, call: GenerateCall, timeout: float = 30.0) -> list[SampleOutput]:
    """Every output of one request."""
    return list(core.submit(call).outputs(timeout))


def run_together(core: EngineCore, calls: list[GenerateCall]) -> dict[str, list | BaseException]:
    """Submit `calls` while the core thread is held, so their first steps share a batch; each
    request's outputs, or the SequenceFailedError it ended with."""
    release = threading.Event()
    held = threading.Thread(target=core.call_on_core, args=(lambda: release.wait(30),))
    held.start()
    handles = [core.submit(call) for call in calls]
    release.set()
    held.join()
    results: dict[str, list | BaseException] = {}
    for call, handle in zip(calls, handles, strict=True):
        try:
            results[call.request_id] = list(handle.outputs(60))
        except SequenceFailedError as error:
            results[call.request_id] = error
    return results


def tokens_of(outputs: list[SampleOutput], sample: int = 0) -> list[int]:
    return [t for o in outputs if o.sample_index == sample for t in o.token_ids]


def final(outputs: list[SampleOutput], sample: int = 0) -> SampleOutput:
    return next(o for o in outputs if o.sample_index == sample and o.finished)


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.01) -> None:
    """Poll until predicate() is true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)


def pages_in_use(core: EngineCore) -> dict[str, int]:
    """Pages with a ref count per pool, read on the core thread."""
    return core.call_on_core(lambda: {n: p.num_in_use for n, p in core.manager.pools.items()})


def turn_after_host_flood(core: EngineCore, monkeypatch, new_tokens: int, seed: int = 5):
    """A conversation's turn 1, five conversations that take every device page (its pages go
    to the host tier), then its turn 2: (turn 1's prompt, turn 2's call, turn 2's outputs, the
    tiers' metrics, the pools whose pages were onboarded, one entry per page)."""
    onboarded: list[str] = []
    onboard = core.manager.tiers.onboard

    def spy(life_cycle, pages, blocks):  # calls through: only notes which pools came back
        onboarded.extend([life_cycle] * len(pages))
        return onboard(life_cycle, pages, blocks)

    monkeypatch.setattr(core.manager.tiers, "onboard", spy)
    rng = random.Random(seed)
    first = tuple(rng.randrange(256) for _ in range(150))
    out1 = tokens_of(run_call(core, GenerateCall("h-t1", first, greedy(new_tokens), "h")))
    for i in range(5):
        flood = tuple(rng.randrange(256) for _ in range(300))
        run_call(core, GenerateCall(f"flood-{i}", flood, greedy(2), f"flood-{i}"))
    prompt = (*first, *out1, *(rng.randrange(256) for _ in range(30)))
    second = GenerateCall("h-t2", prompt, greedy(new_tokens), "h")
    outputs = run_call(core, second)
    metrics = core.call_on_core(lambda: dict(core.manager.tiers.metrics))
    return first, second, outputs, metrics, onboarded


@dataclasses.dataclass
class Served:
    """What `serve_stepped` saw: each request's tokens, and its decode-graph steps."""

    outputs: dict[str, list[int]]
    # per decode-graph step: (inputs taken from the device, requests waiting, running ones
    # left out of the step)
    steps: list[tuple[bool, int, int]]


def serve_stepped(config, storage: str, arrivals: list[tuple[int, GenerateCall]]) -> Served:
    """Step a core from this thread (the same plans every run); each call is submitted before
    the step of its index. Runs until every request has ended."""
    compute = shared_compute(config, storage)
    core = EngineCore(config, compute=compute)
    served = Served({call.request_id: [] for _, call in arrivals}, [])
    original = compute.decode.run if compute.decode is not None else None
    handles = {}
    try:
        if original is not None:

            def run(chunks, feed=None):
                scheduler = core.scheduler
                left_out = len(scheduler.running) - len(chunks)
                served.steps.append((feed is not None, len(scheduler.waiting), left_out))
                return original(chunks, feed)

            compute.decode.run = run
        for step in range(10_000):
            for due, call in arrivals:
                if due == step:
                    handles[call.request_id] = core.submit(call)
            core.run_once()
            for request_id, handle in handles.items():
                while (output := handle.poll()) is not None:
                    assert not isinstance(output, Exception), output
                    served.outputs[request_id].extend(output.token_ids)
            if len(handles) == len(arrivals) and not core._handles:
                break
        else:
            raise AssertionError("the requests never ended")
        core.manager.check_integrity()
        compute.cache.check_integrity()
    finally:
        if original is not None:
            compute.decode.run = original
        core.stop()
    for _, call in arrivals:
        assert len(served.outputs[call.request_id]) == call.sampling.max_tokens
    return served


def random_prompt(seed: int, length: int) -> tuple[int, ...]:
    """`length` random byte-sized token ids, fixed by `seed`."""
    rng = random.Random(seed)
    return tuple(rng.randrange(256) for _ in range(length))
