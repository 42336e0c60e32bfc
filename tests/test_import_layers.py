"""The packages import one way only (`.importlinter` says which way), checked by import-linter."""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_imports_follow_the_layers(tmp_path: Path) -> None:
    """If this fails, a package imports one above it: the report above names the import."""
    config = str(ROOT / ".importlinter")
    assert lint_imports(config_filename=config, cache_dir=str(tmp_path), no_logo=True) == 0


PACKAGE_FOLDERS = ("kvstore", "services", "operator", "proto")


def test_package_files_import_each_other_relatively() -> None:
    """If this fails, a file names a package by its `kvfleet.*` import name, which exists only
    through pyproject's package-dir mapping: editors and structure tools reading the folders
    cannot follow it. Relative imports (`from ..router.store import ...`) mirror the folders.
    Generated gRPC code and `import kvfleet.x` side-effect imports are left as they are."""
    absolute = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in PACKAGE_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "_pb2" not in path.name
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.lstrip().startswith("from kvfleet.")
    ]
    assert not absolute, absolute
