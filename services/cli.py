"""The `kvfleet` command: one entry point, a subcommand per job.

Each subcommand lives in its own module, which exposes `register(subparsers)`; it adds its
parser and sets `func`. Modules are imported only to build the parser, and heavy imports
(torch, grpc) stay inside the command functions so that `kvfleet --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Module path of every subcommand, in the order `kvfleet --help` lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "kvfleet.kvstore.demo",
    "kvfleet.services.router.cli",
    "kvfleet.proto.cli",
    "kvfleet.services.replay.command",
    "kvfleet.operator.cli",
    "kvfleet.services.engine.cli",
    "kvfleet.services.fleet.up",
    "kvfleet.services.engine.model_dir",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvfleet", description="Serve agentic LLM traffic.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_path in SUBCOMMAND_MODULES:
        importlib.import_module(module_path).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
