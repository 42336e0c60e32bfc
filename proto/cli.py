"""`kvfleet proto`: regenerate the Python gRPC code from the .proto files."""

from __future__ import annotations

import argparse


def regenerate(_args: argparse.Namespace | None = None) -> int:
    """Generate every *_pb2*.py file now and print what was written."""
    from .codegen import generate

    for path in generate():
        print(path)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `proto` subcommand."""
    parser = subparsers.add_parser(
        "proto",
        help="regenerate the gRPC code from proto/*.proto",
        description="Regenerate the *_pb2.py, *_pb2_grpc.py and *.pyi files next to "
        "proto/*.proto (importing kvfleet.proto does this when they are missing or stale).",
    )
    parser.set_defaults(func=regenerate)
