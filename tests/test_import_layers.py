"""The packages import one way only (`.importlinter` says which way), checked by import-linter."""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_imports_follow_the_layers(tmp_path: Path) -> None:
    """If this fails, a package imports one above it: the report above names the import."""
    config = str(ROOT / ".importlinter")
    assert lint_imports(config_filename=config, cache_dir=str(tmp_path), no_logo=True) == 0
