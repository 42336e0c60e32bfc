"""`kvfleet replay TRACE... --target SPEC`: replay agent traces and measure prefix reuse.

Before replaying, each target is asked for its model (`describe`): the vocabulary the
synthesised token ids must stay below and the context that turns must fit (turns that do not
are dropped, and a run with nothing left says so and exits 2). Command-line values win.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from .target import HTTP_APIS

DEFAULT_VOCAB_SIZE = 32000


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `replay` subcommand."""
    parser = subparsers.add_parser(
        "replay",
        help="replay agent traces against a target and measure prefix reuse",
        description="Replay Claude Code session files (.json, or a directory of them) and "
        "Mooncake traces (.jsonl) as concurrent sessions; print a table, write --json.",
    )
    parser.add_argument(
        "traces", nargs="+", type=Path, metavar="TRACE", help="trace files or directories"
    )
    parser.add_argument(
        "--target",
        action="append",
        required=True,
        help="http://HOST:PORT[/v1], grpc://HOST:PORT or sim[:FILE.yaml][?k=v&...]; "
        "repeat to compare arms",
    )
    parser.add_argument("--arm", action="append", default=None, help="name per --target")
    parser.add_argument("--json", type=Path, default=None, help="write the measures here")
    parser.add_argument("--plot", type=Path, default=None, help="write PNG plots into DIR")
    parser.add_argument(
        "--records",
        type=Path,
        default=None,
        help="write every request (arm, conversation, turn, tokens, times, rank) as JSON lines",
    )
    parser.add_argument("--sessions", type=int, default=8, help="concurrent sessions")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="think-time multiplier; 0 = no think time"
    )
    parser.add_argument("--stagger", type=float, default=1.0, help="seconds between session starts")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthesised tokens")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="drop turns whose prompt + output is longer (default: the targets' context)",
    )
    parser.add_argument("--limit", type=int, default=None, help="replay the first N conversations")
    parser.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help="replay each conversation's first N turns (after the context filter)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="cap every turn's output at this many tokens (after the context filter, which "
        "still counts the trace's output)",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help=f"token ids are below it (default: the target's, else {DEFAULT_VOCAB_SIZE})",
    )
    parser.add_argument("--model", default="kvfleet", help="model name sent to the target")
    parser.add_argument(
        "--api",
        choices=HTTP_APIS,
        default="completions",
        help="what an http target is sent: token ids to /v1/completions (default), the same "
        "content as a text chat to /v1/chat/completions (with X-Conversation-Id) or to "
        "Anthropic's /v1/messages (Claude Code's cache_control, no conversation header), or "
        "the ids as ASCII text to /v1/completions (ids below 128, for servers and routers that "
        "take no token ids)",
    )
    parser.add_argument(
        "--anthropic-session",
        choices=("metadata", "prefix"),
        default="metadata",
        help="with --api anthropic: name the session in metadata.user_id as Claude Code does "
        "(default), or send nothing and leave it to the server's prefix identity",
    )
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument(
        "--shared-system-prefix",
        action="store_true",
        help="map every Claude Code session's tools+system blocks onto one common chain",
    )
    parser.add_argument(
        "--give-up-after",
        type=int,
        default=8,
        help="stop when this many requests failed before any succeeded; 0: never",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=run)


def replay_config(args: argparse.Namespace) -> dict[str, Any]:
    """Everything needed to rerun a replay."""
    return {
        "traces": [str(p) for p in args.traces],
        "targets": list(args.target),
        "sessions": args.sessions,
        "time_scale": args.time_scale,
        "stagger_s": args.stagger,
        "seed": args.seed,
        "max_model_len": args.max_model_len,
        "limit": args.limit,
        "max_tokens": getattr(args, "max_tokens", None),
        "max_turns": getattr(args, "max_turns", None),
        "vocab_size": args.vocab_size,
        "model": args.model,
        "api": args.api,
        "anthropic_session": args.anthropic_session,
        "request_timeout_s": args.request_timeout,
        "shared_system_prefix": args.shared_system_prefix,
    }


def run(args: argparse.Namespace) -> int:
    """Run the replay; exit status 1 when any request failed (or the first ones all did), 2 on
    a bad trace or target, or when no turn fits the model."""
    from rich.console import Console

    from .claude_code import TraceFormatError
    from .plots import write_plots
    from .report import print_report
    from .target_types import TargetError, TargetUnavailable

    arms = _arm_names(args)
    try:
        results = asyncio.run(_replay(args, arms))
    except (TargetUnavailable, TargetError, TraceFormatError, FileNotFoundError) as error:
        print(f"kvfleet replay: {error}", file=sys.stderr)
        return 2
    except NothingToReplay as error:  # an empty workload is a setup error, not a result
        print(f"kvfleet replay: {error}", file=sys.stderr)
        return 2
    except ArmStopped as error:
        print(f"kvfleet replay: {error}", file=sys.stderr)
        return 1
    print_report({r.name: r.measures for r in results}, Console())
    if args.json is not None:
        payload: dict[str, Any] = (
            results[0].measures.to_json()
            if len(results) == 1
            else {"arms": {r.name: r.measures.to_json() for r in results}}
        )
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    if args.records is not None:
        write_records({r.name: r.records for r in results}, args.records)
    if args.plot is not None:
        write_plots({r.name: r.records for r in results}, args.plot)
    failed = sum(len(r.errors) for r in results)
    for result in results:
        for record in result.errors[:5]:
            print(
                f"{result.name}: {record.conversation_id} turn {record.turn_index}: {record.error}",
                file=sys.stderr,
            )
    return 1 if failed else 0


def write_records(records_by_arm: dict[str, list[Any]], path: Path) -> None:
    """One JSON object per request, failed ones included (their `error` is set)."""
    from dataclasses import asdict

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for arm, records in records_by_arm.items():
            for record in records:
                out.write(json.dumps({"arm": arm, **asdict(record)}) + "\n")


class NothingToReplay(ValueError):
    """Reading and filtering left no turn to send."""


class ArmStopped(RuntimeError):
    """An arm stopped early because its first requests all failed."""


def _arm_names(args: argparse.Namespace) -> list[str]:
    if args.arm is None:
        return list(args.target)
    if len(args.arm) != len(args.target):
        raise SystemExit(f"--arm given {len(args.arm)} times for {len(args.target)} --target")
    return list(args.arm)


async def _replay(args: argparse.Namespace, arms: list[str]) -> list[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from .driver import AllRequestsFailed, DriverOptions
    from .runner import run_arm
    from .target import open_target
    from .target_types import TargetOptions, TargetUnavailable
    from .tokens import TokenSynthesizer

    target_options = TargetOptions(
        args.model, args.request_timeout, args.api, args.anthropic_session
    )
    targets = [open_target(spec, target_options) for spec in args.target]
    try:
        infos = [await target.describe() for target in targets]
        conversations, max_model_len = _workload(args, infos)
        options = DriverOptions(args.sessions, args.time_scale, args.stagger, args.give_up_after)
        total = sum(c.request_count() for c in conversations)
        config = {**replay_config(args), "max_model_len": max_model_len}
        results = []
        for name, spec, target, info in zip(arms, args.target, targets, infos, strict=True):
            vocab = args.vocab_size or info.vocab_size or DEFAULT_VOCAB_SIZE
            if info.vocab_size is not None and vocab > info.vocab_size:
                # Ids past the target's vocabulary would fail every request of the arm.
                raise TargetUnavailable(
                    f"--vocab-size {vocab}: target {spec!r} takes ids below {info.vocab_size}"
                    + (" (--api text: one ASCII byte a token)" if args.api == "text" else "")
                )
            columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            with Progress(*columns, disable=args.no_progress) as progress:
                task = progress.add_task(f"replay {name}", total=total)
                try:
                    result = await run_arm(
                        name,
                        target,
                        conversations,
                        TokenSynthesizer(args.seed, vocab),
                        options,
                        {**config, "target": spec, "arm": name, "vocab_size": vocab},
                        on_record=lambda _record, task=task: progress.advance(task),
                    )
                except AllRequestsFailed as error:
                    raise ArmStopped(f"{name}: stopped, {error}") from error
            results.append(result)
        return results
    finally:
        for target in targets:
            await target.aclose()


def _workload(args: argparse.Namespace, infos: list[Any]) -> tuple[list[Any], int | None]:
    """The conversations to replay and the context they were filtered to (None: unfiltered).

    The tightest context of the targets applies to every arm, so arms replay the same turns.
    """
    from .readers import (
        ReadOptions,
        cap_output_tokens,
        filter_max_model_len,
        first_turns,
        read_traces,
    )

    conversations = read_traces(args.traces, ReadOptions(args.shared_system_prefix))
    reported = [info.max_model_len for info in infos if info.max_model_len]
    max_model_len = args.max_model_len or (min(reported) if reported else None)
    if max_model_len is not None:
        before = sum(c.request_count() for c in conversations)
        conversations = filter_max_model_len(conversations, max_model_len)
        after = sum(c.request_count() for c in conversations)
        source = "--max-model-len" if args.max_model_len else "the target's context"
        if not conversations:
            raise NothingToReplay(
                f"none of the {before} turns fits in {max_model_len} tokens ({source}): "
                "nothing to replay; serve a model with a longer context (kvfleet up "
                "--compute-backend sim --model 8b) or raise --max-model-len"
            )
        if after < before:
            dropped = f"{before - after} of {before} turns are longer than {max_model_len} tokens"
            print(f"kvfleet replay: {dropped} ({source}) and are left out", file=sys.stderr)
    if args.limit is not None:
        conversations = conversations[: args.limit]
    if getattr(args, "max_turns", None) is not None:
        conversations = first_turns(conversations, args.max_turns)
    if getattr(args, "max_tokens", None) is not None:
        conversations = cap_output_tokens(conversations, args.max_tokens)
    return conversations, max_model_len
