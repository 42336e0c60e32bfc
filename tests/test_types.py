"""mypy over kvstore and the router: their Protocols and annotations must hold (pyproject's
[tool.mypy] says what is checked and why a few codes are off where they are)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("kvfleet.kvstore", "kvfleet.services.router")


@pytest.mark.timeout(1200)  # ~30 s alone; minutes beside other CPU-heavy jobs
def test_kvstore_and_router_type_check(tmp_path: Path) -> None:
    """If this fails, the output above names each file, line and type error."""
    # The import names live only in pyproject's package-dir mapping, which mypy cannot read:
    # lay the mapping out as folders of links.
    package = tmp_path / "src" / "kvfleet"
    package.mkdir(parents=True)
    for folder in ("kvstore", "services", "proto"):
        (package / folder).symlink_to(ROOT / folder, target_is_directory=True)
    args = ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache")]
    for name in CHECKED:
        args += ["-p", name]
    # A process of its own: mypy's trees and caches (hundreds of MB) would otherwise stay in
    # pytest's heap, slowing every later collection and the interpreter's exit.
    result = subprocess.run(
        [sys.executable, "-m", "mypy", *args],
        env={**os.environ, "MYPYPATH": str(tmp_path / "src")},
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert result.returncode == 0, result.stdout + result.stderr
