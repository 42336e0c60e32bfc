"""kvfleet's package list, found by walking the folders rather than written by hand.

pyproject.toml maps each top-level folder to its import name ([tool.setuptools.package-dir]:
`services/` is `kvfleet.services`, ...). setuptools' own discovery cannot add that `kvfleet.`
prefix, and a hand-written list silently drops any subpackage nobody remembered to add (the
wheel then lacks it while the editable install, which maps whole folders, still works). So
every folder under a mapped root that holds a .py file is a package, whether or not it has an
__init__.py: `operator/` has none on purpose (a bare `import operator` from the repo root must
still find the standard library) and ships as the namespace package `kvfleet.operator`.
Everything else (metadata, extras, package data) stays in pyproject.toml.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def package_roots() -> dict[str, str]:
    """Import name -> folder, as pyproject.toml maps them."""
    config = tomllib.loads((HERE / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-dir"]


def discover_packages() -> list[str]:
    """Every folder under a mapped root that holds a .py file, as an import name."""
    packages = []
    for name, folder in package_roots().items():
        root = HERE / folder
        for directory in sorted({root, *(path.parent for path in root.rglob("*.py"))}):
            # Bytecode caches hold no .py, but a stray one there must not become a package.
            if "__pycache__" in directory.relative_to(root).parts:
                continue
            packages.append(".".join([name, *directory.relative_to(root).parts]))
    return packages


# setuptools runs this file as __main__; tests import it for discover_packages().
if __name__ == "__main__":
    setup(packages=discover_packages())
