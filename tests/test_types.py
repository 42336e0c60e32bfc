"""mypy over kvstore and the router: their Protocols and annotations must hold (pyproject's
[tool.mypy] says what is checked and why a few codes are off where they are)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("kvfleet.kvstore", "kvfleet.services.router")


@pytest.mark.timeout(1200)  # ~30 s alone; minutes beside other CPU-heavy jobs
def test_kvstore_and_router_type_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
    monkeypatch.setenv("MYPYPATH", str(tmp_path / "src"))
    out, err, status = api.run(args)
    assert status == 0, out + err
