"""What waking the HTTP streams costs per decode step: every stream's reader woken with its own
`call_soon_threadsafe` (how a token was delivered before) against `LoopWakes` (one call into the
loop per burst), the same run.

    .venv/bin/python bench/loop_wakes_bench.py                  # 64 and 256 streams

A "core" thread puts one output per stream per step on the streams' `RequestHandle`s and
wakes them; an asyncio loop in another thread reads them as `EngineBackend.generate` does.
Printed: CPU time of the core thread per step (the wakes are on the engine's critical path) and
of the loop's thread (it shares the interpreter with the core), per stream.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import import_engine, print_table

import_engine()

from kvfleet.services.engine.api.loop_wakes import LoopWakes  # noqa: E402
from kvfleet.services.engine.compute.sampling import SamplingParams  # noqa: E402
from kvfleet.services.engine.core.request_handle import RequestHandle  # noqa: E402
from kvfleet.services.engine.request.engine_request import (  # noqa: E402
    GenerateCall,
    SampleOutput,
)


def per_token_waker(loop: asyncio.AbstractEventLoop, event: asyncio.Event):
    """The wake as it was: one call into the loop per output."""

    def wake() -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(event.set)

    return wake


async def read(handle: RequestHandle, arrived: asyncio.Event, steps: int) -> None:
    """`EngineBackend.generate`'s reading loop."""
    seen = 0
    while seen < steps:
        arrived.clear()
        if handle.poll() is None:
            await arrived.wait()
            continue
        seen += 1


def run(streams: int, steps: int, coalesce: bool) -> tuple[float, float]:
    """CPU seconds per step of the core thread and of the loop's thread."""
    loop = asyncio.new_event_loop()
    handles, readers = [], []
    wakes = LoopWakes(loop)
    for i in range(streams):
        call = GenerateCall(f"r{i}", (1,), SamplingParams(max_tokens=steps), f"c{i}")
        handle = RequestHandle(call, lambda _: None)
        arrived = asyncio.Event()
        if coalesce:
            handle.wake_on_put(lambda event=arrived: wakes.wake(event))
        else:
            handle.wake_on_put(per_token_waker(loop, arrived))
        handles.append(handle)
        readers.append(read(handle, arrived, steps))
    loop_cpu = []

    async def read_all() -> None:
        await asyncio.gather(*readers)

    def serve() -> None:
        start = time.thread_time()
        loop.run_until_complete(read_all())
        loop_cpu.append(time.thread_time() - start)

    thread = threading.Thread(target=serve)
    thread.start()
    time.sleep(0.05)  # the readers are waiting
    core = 0.0
    for step in range(steps):
        start = time.thread_time()
        for i, handle in enumerate(handles):
            handle.put(_output(i, step))
        core += time.thread_time() - start
        time.sleep(0.002)  # the device's step
    thread.join()
    loop.close()
    return core / steps, loop_cpu[0] / steps


def _output(index: int, step: int) -> SampleOutput:
    return SampleOutput(f"r{index}", 0, (step,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="64,256")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="the quickest round counts")
    args = parser.parse_args()
    rows = []
    for streams in (int(s) for s in args.streams.split(",")):
        best = {}
        for _ in range(args.rounds):
            for coalesce in (False, True):
                core, loop = run(streams, args.steps, coalesce)
                old = best.get(coalesce)
                best[coalesce] = (min(core, old[0]), min(loop, old[1])) if old else (core, loop)
        (core_old, loop_old), (core_new, loop_new) = best[False], best[True]
        rows.append(
            [
                streams,
                core_old / streams * 1e6,
                core_new / streams * 1e6,
                loop_old / streams * 1e6,
                loop_new / streams * 1e6,
            ]
        )
    print_table(
        "waking the streams per decode step, us of CPU per stream (outputs put included)",
        ["streams", "core: per token", "core: LoopWakes", "loop: per token", "loop: LoopWakes"],
        rows,
    )


if __name__ == "__main__":
    main()
