"""The packages import one way only (`.importlinter` says which way, checked by import-linter),
and the engine's packages and modules import each other without cycles."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_imports_follow_the_layers(tmp_path: Path) -> None:
    """If this fails, a package imports one above it: the report below names the import."""
    # In a process of its own: import-linter configures logging, which disables every logger
    # that already exists (later tests' caplog then saw nothing from kvstore).
    script = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(ROOT / '.importlinter')!r}, "
        f"cache_dir={str(tmp_path)!r}, no_logo=True))"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


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


ENGINE = ROOT / "services" / "engine"


def engine_modules() -> dict[str, Path]:
    """Every engine module by its name from the engine down (`api.openai_http`; a package's
    `__init__` by the package's name, `compute.tp`; the engine's own by "")."""
    modules = {}
    for path in ENGINE.rglob("*.py"):
        parts = path.relative_to(ENGINE).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def engine_imports(modules: dict[str, Path]) -> list[tuple[str, str, str]]:
    """(importer, imported, file:line) for every import of one engine module by another,
    wherever it stands: at the top, under `if TYPE_CHECKING:` or inside a function."""
    found = []
    for importer, path in modules.items():
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        parts = package.split(".") if package else []
        for node in ast.walk(ast.parse(path.read_text())):
            # Package files import each other relatively (the test above); a level past the
            # engine's top reaches another package of kvfleet.
            if not isinstance(node, ast.ImportFrom) or not 0 < node.level <= len(parts) + 1:
                continue
            stem = ".".join([*parts[: len(parts) - node.level + 1], node.module or ""]).strip(".")
            for alias in node.names:
                submodule = f"{stem}.{alias.name}".strip(".")
                imported = submodule if submodule in modules else stem
                if imported in modules and imported != importer:
                    found.append((importer, imported, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return found


def first_cycle(edges: dict[str, dict[str, str]]) -> list[str]:
    """One cycle of the graph as `node (where its import is)` steps, or [] when it has none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str]:
        path.append(node)
        for nxt in sorted(edges.get(node, {})):
            if nxt in path:
                loop = [*path[path.index(nxt) :], nxt]
                steps = [f"{a or 'engine'} ({edges[a][b]})" for a, b in itertools.pairwise(loop)]
                return [*steps, nxt or "engine"]
            if nxt not in done and (cycle := visit(nxt)):
                return cycle
        path.pop()
        done.add(node)
        return []

    for node in sorted(edges):
        if node not in done and (cycle := visit(node)):
            return cycle
    return []


@pytest.mark.parametrize("granularity", ["package", "module"])
def test_the_engine_imports_without_cycles(granularity: str) -> None:
    """If this fails, two engine packages (a folder's own modules: `compute` and `compute.tp`
    are two) or two engine modules import each other, maybe through an import inside a
    function: the message walks the cycle, with the file and line of each import."""
    modules = engine_modules()

    def node(name: str) -> str:
        if granularity == "module" or modules[name].name == "__init__.py":
            return name
        return name.rpartition(".")[0]

    edges: dict[str, dict[str, str]] = {}
    for importer, imported, where in engine_imports(modules):
        if node(importer) != node(imported):
            edges.setdefault(node(importer), {}).setdefault(node(imported), where)
    cycle = first_cycle(edges)
    assert not cycle, " -> ".join(cycle)
