"""Benchmark: peer routers and kvfleet's router in front of the same sim-backend engine ranks.

Each arm starts fresh ranks (`kvfleet engine --compute-backend sim`, empty caches), one router
in front of them, and replays the same Claude Code slice through it with `kvfleet replay`; one
table compares prefix reuse (and its share of the oracle), later turns with no reuse and TTFT,
with ratios against a baseline arm of the same run (sglang round_robin).

- sglang-router takes no token-id prompts, so its arms send the same tokens as ASCII text
  (`text+http://`, token ids < 128; the ranks' byte tokenizer maps them back one to one).
- vllm-router gets token ids (its cache_aware renders them through `/v1/completions/render`).
- kvfleet's router is replayed over grpc:// (its Generate stream), pins in-process.

Run: .venv/bin/python bench/peers_bench.py [--arms NAME ...] [--sessions 8] [--kv-pages 1200]
Needs the optional peers: .venv/bin/pip install -e '.[dev,peers]' (arms whose router is not
installed are listed as skipped, with the reason).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from kvfleet.services.engine.config import preset
from kvfleet.services.engine.model_dir import write_model_dir
from kvfleet.services.replay.http_target import OpenAICompletionsTarget
from kvfleet.services.replay.target import TARGET_FACTORIES
from kvfleet.services.replay.target_types import TargetOptions
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_fleet import ROUTER_NEEDS, ROUTERS, Fleet, RankSettings, router_available

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "claude_code_weka"
# Sessions whose first turns fit 32k tokens, each with 3-5 of them (a small, quick slice).
SLICE = ("0162", "0242", "0012", "0052", "0261", "0260", "0142", "0011", "0070", "0051")
TEXT_VOCAB = 128  # ASCII: every token id is one byte the ranks' byte tokenizer maps back
BASELINE = "sglang round_robin"

# arm name -> (router, policy)
ARMS: dict[str, tuple[str, str]] = {
    "kvfleet strict": ("kvfleet", "strict"),
    "kvfleet lenient": ("kvfleet", "lenient"),
    "sglang cache_aware": ("sglang", "cache_aware"),
    "sglang round_robin": ("sglang", "round_robin"),
    "sglang power_of_two": ("sglang", "power_of_two"),
    "vllm cache_aware": ("vllm", "cache_aware"),
    "vllm consistent_hash": ("vllm", "consistent_hash"),
    "vllm round_robin": ("vllm", "round_robin"),
    "dynamo kv_router": ("dynamo", "kv_router"),
    "dynamo radix_tree": ("dynamo", "radix_tree"),
}


class TextCompletionsTarget(OpenAICompletionsTarget):
    """OpenAI completions with the prompt as ASCII text (for routers that take no token ids)."""

    def request_body(self, conversation_id: str, tokens: list[int], max_tokens: int) -> dict:
        if max(tokens) >= TEXT_VOCAB:
            raise ValueError(f"token id {max(tokens)} >= {TEXT_VOCAB}: not one ASCII byte")
        body = super().request_body(conversation_id, tokens, max_tokens)
        body["prompt"] = bytes(tokens).decode("ascii")
        return body


def _open_text(spec: str, options: TargetOptions) -> TextCompletionsTarget:
    url = "http://" + spec.split("://", 1)[1]
    return TextCompletionsTarget(url, model=options.model, timeout_s=options.request_timeout_s)


TARGET_FACTORIES["text+http"] = _open_text


def replay(spec: str, arm: str, out: Path, args: argparse.Namespace) -> dict:
    """`kvfleet replay` of the slice against `spec`; its JSON measures."""
    from kvfleet.services.cli import main

    traces = [str(TRACES / f"trace_{name}.json") for name in SLICE[: args.limit]]
    argv = [
        "replay",
        *traces,
        "--target",
        spec,
        "--arm",
        arm,
        "--json",
        str(out),
        "--sessions",
        str(args.sessions),
        "--time-scale",
        "0",
        "--seed",
        "1",
        "--max-model-len",
        str(args.max_model_len),
        "--vocab-size",
        str(TEXT_VOCAB),
        "--model",
        "kvfleet",
        "--request-timeout",
        "300",
        "--no-progress",
    ]
    status = main(argv)
    if status != 0:
        raise RuntimeError(f"replay of {arm} exited {status}")
    return json.loads(out.read_text())


def run_arm(name: str, settings: RankSettings, args: argparse.Namespace, root: Path) -> dict:
    router, policy = ARMS[name]
    workdir = root / name.replace(" ", "_")
    workdir.mkdir()
    fleet = Fleet(workdir)
    try:
        spec = ROUTERS[router](fleet, settings, args.ranks, policy)
        return replay(spec, name, workdir / "replay.json", args)
    finally:
        fleet.stop()


def print_table(results: dict[str, dict], skipped: dict[str, str], args) -> None:
    table = Table(
        title=f"Peers on the same traffic: {args.ranks} sim ranks x "
        f"{args.max_batch_size} slots, {args.kv_pages} KV pages each (higher reuse, "
        f"lower TTFT = better; ratios vs {BASELINE})"
    )
    columns = (
        "arm",
        "prefix reuse",
        "oracle",
        "of oracle",
        "later turns no reuse",
        "TTFT p50 s",
        "TTFT p90 s",
        "reuse vs base",
        "TTFT p90 base/arm",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "arm" else "right")
    base = results.get(BASELINE)
    for name, m in results.items():
        reuse_ratio = p90_ratio = "-"
        if base:
            reuse_ratio = f"{m['prefix_reuse'] / max(base['prefix_reuse'], 1e-9):.2f}x"
            p90_ratio = f"{base['ttft_p90_s'] / max(m['ttft_p90_s'], 1e-9):.2f}x"
        table.add_row(
            name,
            f"{m['prefix_reuse']:.3f}",
            f"{m['oracle_reuse']:.3f}",
            f"{m['prefix_reuse'] / max(m['oracle_reuse'], 1e-9):.1%}",
            f"{m['later_turns_no_reuse']:.1%}",
            f"{m['ttft_p50_s']:.3f}",
            f"{m['ttft_p90_s']:.3f}",
            reuse_ratio,
            p90_ratio,
        )
    Console(width=160).print(table)
    first = next(iter(results.values()), None)
    if first:
        print(
            f"workload: {first['requests']} requests, {first['prompt_tokens']:,} prompt tokens "
            f"from {args.limit} Claude Code sessions (max_model_len {args.max_model_len}), "
            f"{args.sessions} concurrent, think time 0; sim time scale {args.sim_time_scale}"
        )
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=4)
    parser.add_argument("--kv-pages", type=int, default=1200, help="64-token pages per rank")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--limit", type=int, default=len(SLICE), help="sessions of the slice")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--sim-time-scale", type=float, default=0.25)
    parser.add_argument("--json", type=Path, default=None, help="write every arm's measures")
    args = parser.parse_args()

    results: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kvfleet-peers-") as tmp:
        root = Path(tmp)
        model = preset("8b").with_changes(max_position=args.max_model_len + 1024)
        settings = RankSettings(
            model_dir=write_model_dir(root / "model", model),
            max_batch_size=args.max_batch_size,
            kv_pages=args.kv_pages,
            sim_time_scale=args.sim_time_scale,
        )
        for name in args.arms:
            router = ARMS[name][0]
            if not router_available(router):
                skipped[name] = f"{ROUTER_NEEDS[router]} is not installed (extra 'peers')"
                continue
            try:
                results[name] = run_arm(name, settings, args, root)
            except (RuntimeError, TimeoutError) as error:
                skipped[name] = str(error)
    print_table(results, skipped, args)
    if args.json is not None:
        args.json.write_text(json.dumps({"arms": results, "skipped": skipped}, indent=2))


if __name__ == "__main__":
    main()
