"""The `kvfleet` command explains itself: a description per command, help and defaults for
every flag, `--version`; and `kvfleet router` fails cleanly on a taken port."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from kvfleet.services.cli import build_parser, main
from kvfleet.services.router.cli import router_config

ROOT = Path(__file__).resolve().parents[1]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_command_has_a_description_and_help_for_every_flag(name: str) -> None:
    """If this fails, a command or one of its flags has no explanation in --help."""
    parser = subcommands()[name]
    assert parser.description, f"kvfleet {name} has no description"
    bare = [a.option_strings or [a.dest] for a in parser._actions if not a.help]
    assert not bare, f"kvfleet {name}: flags without help: {bare}"


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """If this fails, a user cannot see what a flag does when left out."""
    with pytest.raises(SystemExit):
        main(["up", "--help"])
    out = capsys.readouterr().out
    assert "(default: 8000)" in out and "(default: strict)" in out


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    """If this fails, `kvfleet --version` is missing or disagrees with pyproject.toml."""
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"kvfleet {expected}"


def test_router_redis_timeout_is_settable() -> None:
    """If this fails, the router's Redis timeout cannot be tuned from its command line."""
    args = build_parser().parse_args(["router", "--redis-timeout-seconds", "0.25"])
    assert router_config(args).redis_timeout_seconds == 0.25


def test_router_on_a_taken_port_exits_two_and_names_the_flag() -> None:
    """If this fails, `kvfleet router` ends in a traceback when its port is taken."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "kvfleet.services.cli", "router", "--host", "127.0.0.1",
             "--grpc-port", str(port), "--metrics-port", "-1", "--rank-port", "0",
             "--insecure-rank-port"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"--grpc-port {port}" in result.stderr
    assert "Traceback" not in result.stderr
