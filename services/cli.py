"""The `kvfleet` command: one entry point, a subcommand per job.

Each subcommand lives in its own module, which exposes `register(subparsers)`; it adds its
parser (with a description and help for every flag) and sets `func`. Modules are imported only
to build the parser, and heavy imports (torch, grpc) stay inside the command functions so that
`kvfleet --help` is instant. Every command's help shows the flags' defaults.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

# Module path of every subcommand, in the order `kvfleet --help` lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "kvfleet.kvstore.demo",
    "kvfleet.services.fleet.router_command",
    "kvfleet.proto.cli",
    "kvfleet.services.replay.command",
    "kvfleet.operator.cli",
    "kvfleet.services.engine.rank.cli",
    "kvfleet.services.fleet.up",
    "kvfleet.services.engine.model.model_dir",
)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default, except where there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def package_version() -> str:
    """The installed kvfleet's version ("unknown" when run from a tree never installed)."""
    try:
        return version("kvfleet")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvfleet",
        description="Serve multi-turn agentic LLM traffic: prefix-affine routing, a "
        "retention-aware KV cache with host and disk tiers, replay and simulation.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvfleet {package_version()}")
    subparsers = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=SubcommandParser
    )
    for module_path in SUBCOMMAND_MODULES:
        importlib.import_module(module_path).register(subparsers)
    return parser


class SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser: defaults shown in its help."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
