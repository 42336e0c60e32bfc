"""The distribution lists every package folder and ships every data file under the roots.

Reads the package list, package-dir and package data the way setuptools resolves them for a
build (setup.py run to its configuration step, pyproject.toml applied), without building: the
wheel itself is checked by test_wheel_installs.py (slow).
"""

from __future__ import annotations

import fnmatch
import os
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def distribution():
    # setuptools' distutils (its .pth hook makes `distutils` that one): runs setup.py the way
    # a build does, stopping once pyproject.toml is applied.
    from distutils.core import run_setup

    cwd = os.getcwd()
    os.chdir(ROOT)  # setuptools reads pyproject.toml from the working directory
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation notices about pyproject's metadata
            return run_setup("setup.py", stop_after="config")
    finally:
        os.chdir(cwd)


def folder_of(package: str, package_dir: dict[str, str]) -> Path:
    """The folder a package is built from: its nearest mapped parent's folder plus the rest."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        mapped = package_dir.get(".".join(parts[:cut]))
        if mapped is not None:
            return ROOT / mapped / Path(*parts[cut:])
    raise AssertionError(f"{package} is under no package-dir root")


def source_folders(package_dir: dict[str, str]) -> dict[Path, str]:
    """Every folder under the roots that is a package: it holds a .py file (an __init__.py or,
    like operator/, only modules)."""
    found = {}
    for name, folder in package_dir.items():
        root = ROOT / folder
        for path in root.rglob("*.py"):
            relative = path.parent.relative_to(root)
            if "__pycache__" not in relative.parts:
                found[path.parent] = ".".join([name, *relative.parts])
    return found


def test_every_package_folder_is_listed(distribution) -> None:
    """If this fails, a folder with Python code under kvstore/, services/, operator/ or proto/
    is missing from the package list: the wheel (and every image) lacks it while the editable
    install still imports it. setup.py builds the list; a hand-written `packages` in
    pyproject.toml overrides it."""
    listed = set(distribution.packages)
    missing = sorted(set(source_folders(distribution.package_dir).values()) - listed)
    assert not missing, f"not packaged: {missing}"
    assert "kvfleet.operator" in listed  # no __init__.py there, on purpose


def test_every_listed_package_is_built_from_its_folder(distribution) -> None:
    """If this fails, a listed package points at a folder that does not exist (a renamed or
    removed folder, or a package-dir entry that no longer matches)."""
    absent = [
        package
        for package in distribution.packages
        if not folder_of(package, distribution.package_dir).is_dir()
    ]
    assert not absent, absent


def test_every_data_file_under_the_roots_is_package_data(distribution) -> None:
    """If this fails, a non-Python file under the roots (a .proto, a .yaml the code loads) is
    matched by no [tool.setuptools.package-data] glob of its package or a package above it, so
    the wheel leaves it out."""
    listed = set(distribution.packages)
    for package in distribution.package_data:
        assert package in listed, f"package-data for {package}, which is not packaged"
    folders = {folder_of(package, distribution.package_dir): package for package in listed}
    uncovered = []
    for folder in sorted({ROOT / root for root in distribution.package_dir.values()}):
        for path in folder.rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc"):
                continue
            covered = any(
                fnmatch.fnmatch(str(path.relative_to(base)), glob)
                for base, package in folders.items()
                if base in path.parents
                for glob in distribution.package_data.get(package, [])
            )
            if not covered:
                uncovered.append(str(path.relative_to(ROOT)))
    assert not uncovered, f"not package data: {uncovered}"
