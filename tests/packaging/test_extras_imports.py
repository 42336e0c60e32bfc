"""The router and operator commands run on their extras alone: no torch, no engine packages.

Each check runs a fresh interpreter in which the import of every package outside the core
dependencies and the command's extra fails (a meta-path finder), as on the router and operator
images. bench/readonly_install_check.sh does the same with a real install on a read-only
site-packages, as a non-root user.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# Import names of the distributions the extras add (a new extra dependency must be listed).
IMPORT_NAMES = {
    "torch": "torch",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "jinja2": "jinja2",
    "huggingface-hub": "huggingface_hub",
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "kopf": "kopf",
    "kubernetes": "kubernetes",
    "matplotlib": "matplotlib",
    "grpcio-tools": "grpc_tools",
    "llguidance": "llguidance",
}
PROBE = textwrap.dedent(
    """
    import importlib, importlib.abc, sys
    blocked = set(sys.argv[1].split(","))

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                raise ImportError(f"{name} is not installed with this extra")

    sys.meta_path.insert(0, Blocked())
    for module in sys.argv[3:]:
        importlib.import_module(module)
    from kvfleet.services.cli import main
    try:
        main([sys.argv[2], "--help"])
    except SystemExit as done:
        assert not done.code, done.code
    assert "torch" not in sys.modules
    assert "kvfleet.proto.codegen" not in sys.modules  # nothing is generated at run time
    """
)


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[=<>\\[ ]", requirement)[0].lower() for requirement in requirements}


def blocked_for(extra: str) -> list[str]:
    """Import names of every extra's packages except `extra`'s and the core's."""
    extras = project()["optional-dependencies"]
    kept = names(project()["dependencies"]) | names(extras[extra])
    added = set().union(
        *(names(extras[name]) for name in ("engine", "router", "operator", "replay"))
    )
    added.add("grpcio-tools")
    return sorted(IMPORT_NAMES[name] for name in added - kept)


def test_core_dependencies_carry_no_torch_and_every_extra_package_is_classified():
    """If this fails, torch is back in the core (router and operator images carry it), or a new
    extra package is not blocked by the checks below."""
    extras = project()["optional-dependencies"]
    assert not names(project()["dependencies"]) & {"torch", "safetensors", "tokenizers"}
    for extra in ("engine", "router", "operator", "replay"):
        assert names(extras[extra]) <= set(IMPORT_NAMES), extra
    assert "kvfleet[all]" in extras["dev"]


@pytest.mark.parametrize(
    ("extra", "command", "modules"),
    [
        ("router", "router", ["kvfleet.services.router.server", "kvfleet.proto.router_pb2_grpc"]),
        ("operator", "operator", ["kvfleet.operator.handlers"]),
    ],
)
def test_command_runs_without_other_extras(extra, command, modules):
    """If this fails, `kvfleet router/operator` imports torch (or another extra's package, or
    grpc_tools to generate protos) and crashes on its image."""
    blocked = blocked_for(extra)
    assert "torch" in blocked and "grpc_tools" in blocked
    result = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(blocked), command, *modules],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"usage: kvfleet {command}" in result.stdout
