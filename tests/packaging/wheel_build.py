"""Build kvfleet's wheel from what the images copy, and install it into a fresh venv.

The build runs on a copy of the build inputs, never in the checkout: setuptools reuses a
`build/` folder left by an earlier build, and its stale files would hide a package the current
configuration drops.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "docker" / "constraints.txt"


def package_roots() -> dict[str, str]:
    """Import name -> folder ([tool.setuptools.package-dir])."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-dir"]


def build_inputs() -> list[str]:
    """What a build reads (and so what each Dockerfile must COPY): the build configuration,
    the README (the long description) and the package roots."""
    return ["pyproject.toml", "setup.py", "README.md", *package_roots().values()]


def clean_env() -> dict[str, str]:
    """This environment without anything that would let a child import from the checkout."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"  # a shared 2-core machine: one torch thread
    return env


def build_wheel(work: Path) -> Path:
    """Build the wheel from a copy of the build inputs under `work`; its path."""
    source = work / "src"
    for name in build_inputs():
        path = ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(path, source / name, ignore=ignore, dirs_exist_ok=True)
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), "."],
        cwd=source, env=clean_env(), check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    (wheel,) = (work / "dist").glob("kvfleet-*.whl")
    return wheel


def fresh_venv(path: Path, requirement: str) -> Path:
    """A new venv (no system site-packages, no editable kvfleet) with `requirement` installed
    under the images' pins; its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
    result = subprocess.run(
        [*pip, "-c", str(CONSTRAINTS), requirement],
        env=clean_env(), capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return path / "bin"
