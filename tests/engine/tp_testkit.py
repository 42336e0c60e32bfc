"""Starting a tensor-parallel rank's workers as processes on this machine (gloo, a file://
rendezvous, so no port can be taken by someone else), with a deadline and a clean teardown."""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

DEADLINE_S = 300


def run_workers(script: Path, world: int, tmp: Path, *args: str) -> None:
    """Run `script --rank=R --world=W --rendezvous=... *args` for every rank; fail with the
    failing workers' logs, and kill what is left, whatever happens."""
    rendezvous = tmp / "rendezvous"
    procs, logs = [], []
    try:
        for rank in range(world):
            log = (tmp / f"worker{rank}.log").open("w")
            logs.append(log)
            cmd = [sys.executable, str(script), f"--rank={rank}", f"--world={world}"]
            cmd += [f"--rendezvous={rendezvous}", *args]
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        for proc in procs:
            proc.wait(timeout=DEADLINE_S)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    if failed:
        text = "\n".join((tmp / f"worker{r}.log").read_text()[-3000:] for r, _ in failed)
        pytest.fail(f"workers {failed} failed:\n{text}")


@contextlib.contextmanager
def worker_group(rendezvous: str, rank: int, world: int) -> Iterator[None]:
    """The worker side: the gloo group (a generous timeout for a loaded machine) for the
    block's length; a block that ends normally leaves it as the product does (everyone meets,
    then tears down), one that raises just tears down."""
    import faulthandler
    from datetime import timedelta

    import torch.distributed as dist
    from kvfleet.services.engine.compute.rank_group import leave_rank_group

    faulthandler.enable()  # a worker that dies on a signal leaves its Python stacks in its log
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    try:
        yield
        leave_rank_group()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def worker_arguments() -> argparse.Namespace:
    """What run_workers passes a worker script, plus its --checkpoint and --out."""
    parser = argparse.ArgumentParser()
    for name in ("rank", "world"):
        parser.add_argument(f"--{name}", type=int, required=True)
    for name in ("rendezvous", "checkpoint", "out"):
        parser.add_argument(f"--{name}", required=True)
    return parser.parse_args()
