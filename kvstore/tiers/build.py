"""Build a rank's tiers from config: real bytes for an engine, an index alone for the simulator
(with marker files in a shared folder for a byte-less engine rank)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import KVStoreConfig
from .disk_files import DiskFiles, MarkerFiles, NoDiskFiles
from .disk_tier import DISK_READ_THREADS
from .layout import KVLayout
from .stack import KVTiers
from .write_behind import WriteBehindFiles

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierConfig:
    """Pages per life cycle on host and on disk, the shared disk folder, prefetch depth.

    `disk_dir` None with a layout: no disk tier. Without a layout (the simulator, the engine's
    `sim` backend) the disk tier is an index of `disk_pages`, over marker files (no payload) in
    `disk_dir`/byteless when a folder is given.
    """

    host_pages: Mapping[str, int] = field(default_factory=dict)
    disk_pages: Mapping[str, int] = field(default_factory=dict)
    disk_dir: str | None = None
    disk_prefetch_num_reqs: int = 0
    prefetch_queue_blocks: int = 256
    disk_read_threads: int = DISK_READ_THREADS  # an admission's block files read at once
    host_exclusive: bool = True  # a block onboarded from host leaves it (KVTiers)
    # block files written by a thread of their own, so the core thread does not wait on file I/O
    # (write_behind.py); off: written where they are evicted
    disk_write_behind: bool = False


def build_tiers(
    store: KVStoreConfig, tiers: TierConfig, layout: KVLayout | None = None, device: Any = None
) -> KVTiers:
    """Tiers for a manager of `store`: TorchBytes (device KV + host rows) when `layout` is given.

    A disk folder that cannot be created or written logs a warning and leaves no disk tier.
    """
    names = [life_cycle.name for life_cycle in store.life_cycles]
    unknown = sorted((set(tiers.host_pages) | set(tiers.disk_pages)) - set(names))
    if unknown:
        raise ValueError(f"tier pages name unknown life cycles {unknown}; known: {names}")
    host = {name: tiers.host_pages.get(name, 0) for name in names}
    disk = {name: tiers.disk_pages.get(name, 0) for name in names}
    common: dict[str, Any] = {
        "disk_prefetch_num_reqs": tiers.disk_prefetch_num_reqs,
        "prefetch_queue_blocks": tiers.prefetch_queue_blocks,
        "disk_read_threads": tiers.disk_read_threads,
        "host_exclusive": tiers.host_exclusive,
    }
    if layout is None:
        markers = _open_markers(tiers.disk_dir, names)
        if tiers.disk_dir is not None and markers is None:
            disk = dict.fromkeys(names, 0)
        return KVTiers(host, disk, dict.fromkeys(names, 0), disk_files=markers, **common)
    missing = sorted(set(names) - set(layout.layers))
    if missing:
        raise ValueError(f"layout has no layers entry for life cycles {missing}")
    from .torch_bytes import TorchBytes  # torch only where bytes are real

    byte_store = TorchBytes(layout, store.pool_pages, host, device)
    page_bytes = {name: layout.page_bytes(name) for name in names}
    files = _open_disk(tiers.disk_dir, layout, names, tiers.disk_write_behind)
    if isinstance(files, NoDiskFiles):
        disk = dict.fromkeys(names, 0)
    return KVTiers(host, disk, page_bytes, byte_store, files, **common)


def _open_markers(disk_dir: str | None, names: list[str]) -> MarkerFiles | None:
    """Byte-less ranks' marker files under `disk_dir`, or None (no folder, or unusable)."""
    if disk_dir is None:
        return None
    root = os.path.join(disk_dir, "byteless")
    files = MarkerFiles(root, {name: f"byteless/{name}".encode() for name in names})
    try:
        files.probe()
    except OSError as error:
        log.warning("disk tier at %s unusable (%s): no disk tier", root, error)
        return None
    return files


def _open_disk(disk_dir: str | None, layout: KVLayout, names: list[str], write_behind: bool):
    if disk_dir is None:
        return NoDiskFiles()
    fingerprints = {name: layout.fingerprint(name) for name in names}
    files = DiskFiles(disk_dir, fingerprints)
    try:
        files.probe()
    except OSError as error:
        log.warning("disk tier at %s unusable (%s): no disk tier", disk_dir, error)
        return NoDiskFiles()
    return WriteBehindFiles(disk_dir, fingerprints) if write_behind else files
