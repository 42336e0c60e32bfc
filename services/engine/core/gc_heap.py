"""The serving process's startup heap, kept out of the garbage collector's full passes.

CPython's oldest-generation collection walks every tracked object. In a serving process that
is torch's, the model's and the engine's hundreds of thousands of startup objects, none of them
ever garbage: on the CPU (`bench/decode_host_bench.py`, batch 256) one pass took ~120 ms, about
every 100 decode steps, longer than the steps between. Frozen once the process has started
(`gc.freeze`, as vLLM does after its warm-up), they are skipped; what is made later is
collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect, then move every object alive now out of the collector's passes (call once the
    process has started, before traffic); returns how many are frozen."""
    gc.collect()  # garbage alive at the freeze would never be collected
    gc.freeze()
    return gc.get_freeze_count()


def thaw_heap() -> None:
    """Undo `freeze_startup_heap` (a process that drops its engine and goes on: the frozen
    objects that became garbage are collected again)."""
    gc.unfreeze()
