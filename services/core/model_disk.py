"""Where one model's blocks live in the shared disk tier (its tier files and hand-off files)."""

from __future__ import annotations

import os

import xxhash


def model_disk_root(disk_tier_dir: str, model_name: str, model_path: str | None, seed: int) -> str:
    """This model's folder of the shared disk tier.

    NOTE: block hashes name tokens, not weights, and file fingerprints only the page shape, so
    ranks of another model (or other random weights) of the same shape must not read these.
    """
    identity = model_path or f"{model_name}/seed={seed}"
    return os.path.join(disk_tier_dir, f"model-{xxhash.xxh3_64_hexdigest(identity.encode())}")
