"""`kvfleet router`: the router's own command (services/router/cli.py) plus the OpenAI HTTP
front beside it (`--http-port`), composed here because the front is built on the engine's
OpenAI app and the router knows no engine."""

from __future__ import annotations

import argparse

from ..engine.api.tool_calls import add_tool_call_parser_flag
from ..router import cli as router_cli


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `router` subcommand, serving the OpenAI API next to gRPC."""
    parser = router_cli.register(subparsers)
    add_tool_call_parser_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return router_cli.run(args, front=start_front)


def start_front(args: argparse.Namespace, grpc_port: int, details=None):
    """The OpenAI HTTP front over this process's router on `grpc_port` (plain gRPC: the
    loopback port when the client port serves TLS). With the router's certificate the HTTP
    port serves HTTPS too, so neither client door is left in the clear. `details`: what
    /health adds (the router's Redis state)."""
    from ..engine.api.tool_calls import resolve_tool_family
    from .router_front import RouterFront, front_tokenizer

    tls = (args.tls_cert_file, args.tls_key_file) if args.tls_cert_file else None
    local = "127.0.0.1" if tls or args.host in ("0.0.0.0", "::", "") else args.host
    tokenizer = front_tokenizer(args.model_path)
    names = (args.model, "kvfleet")
    template = getattr(tokenizer, "chat_template", None)
    family = resolve_tool_family(args.tool_call_parser, template, args.model_path)
    return RouterFront(
        f"{local}:{grpc_port}", tokenizer, names, None, args.host, args.http_port, tls, family,
        health_details=details,
    ).start()  # fmt: skip
