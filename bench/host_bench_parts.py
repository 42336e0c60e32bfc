"""What the engine's host benches share: a small model shape whose forward costs nothing (so
a step's time is the engine's host work), and a timer of named methods.

Imported after `gpu_common.import_engine()`: the benches run against this checkout's engine or
a baseline's (`baseline_tree`), and what is used here exists in both.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from gpu_common import REPO
from kvfleet.services.engine.config.model_config import PRESETS, ModelConfig


def register_host_shape(name: str, max_position: int) -> str:
    """A tiny preset `name` (2 layers, 320 tokens) whose context reaches `max_position`."""

    def shape() -> ModelConfig:
        return ModelConfig(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            max_position=max_position,
            name=name,
        )

    PRESETS.setdefault(name, shape)
    return name


class FreeModel(torch.nn.Module):
    """Logits of zeros for every sequence of the batch: a forward that costs nothing."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, batch, cache, backend) -> torch.Tensor:
        return torch.zeros(batch.num_sequences, self.vocab)


class MethodTimer:
    """Wraps named methods of objects and sums their time and calls by name while `on`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.totals: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.on = False

    def wrap(self, owner, attribute: str, name: str) -> None:
        original = getattr(owner, attribute, None)
        if original is None:
            return  # a tree without this call

        def timed(*args, **kwargs):
            if not self.on:
                return original(*args, **kwargs)
            start = self.clock()
            try:
                return original(*args, **kwargs)
            finally:
                self.totals[name] += self.clock() - start
                self.calls[name] += 1

        setattr(owner, attribute, timed)


def baseline_tree(ref: str) -> Path:
    """A folder whose `kvfleet` package is git REF's kvstore, services and proto."""
    root = Path(tempfile.mkdtemp(prefix="host-bench-baseline-"))
    tree, package = root / "tree", root / "shim" / "kvfleet"
    tree.mkdir()
    package.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "kvstore", "services", "proto"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for folder in ("kvstore", "services", "proto"):
        (package / folder).symlink_to(tree / folder)
    return package.parent
