"""Benchmark: peer routers and kvfleet's router in front of the same sim-backend engine ranks.

Each arm starts fresh ranks (`kvfleet engine --compute-backend sim`, empty caches), one router
in front of them, and replays the same Claude Code slice through it with `kvfleet replay`; one
table compares prefix reuse (and its share of the oracle), later turns with no reuse and TTFT,
with ratios against a baseline arm of the same run (sglang round_robin).

- sglang-router takes no token-id prompts, so its arms send the same tokens as ASCII text
  (the replay's `--api text`, token ids < 128; the ranks' byte tokenizer maps them back one
  to one).
- vllm-router gets token ids (its cache_aware renders them through `/v1/completions/render`).
- kvfleet's router is replayed over grpc:// (its Generate stream), pins in-process.

Two regimes, one table each. **Saturated** (the default first table): 4 ranks x 2 slots and 16
concurrent sessions (16 sessions of the held-out half with 3-8 turns under 32k tokens), fewer
slots than sessions, so turns queue and the router's affinity decides where they wait; every
arm runs once per (seed, stagger) in `--runs` and the table gives mean and min-max.
**Unsaturated** (second table, `--regime both`): the earlier 2 ranks x 4 slots, 8 sessions.

Run: .venv/bin/python bench/peers_bench.py [--arms NAME ...] [--regime saturated|both]
     [--runs 1:1,2:3] [--kv-pages 1200]
Needs the optional peers: .venv/bin/pip install -e '.[dev,peers]' (arms whose router is not
installed are listed as skipped, with the reason).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.model.model_dir import write_model_dir
from kvfleet.services.replay.claude_code import read_claude_code
from kvfleet.services.replay.text_target import TEXT_VOCAB
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_fleet import (
    ROUTER_NEEDS,
    ROUTERS,
    SERVED_MODEL,
    TEXT_SCHEME,
    Fleet,
    RankSettings,
    router_available,
)
from sim_bench import session_files

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "claude_code_weka"
# Sessions whose first turns fit 32k tokens, each with 3-5 of them (a small, quick slice).
SLICE = ("0162", "0242", "0012", "0052", "0261", "0260", "0142", "0011", "0070", "0051")
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


@dataclass(frozen=True)
class Regime:
    """Fleet shape and load of one table."""

    name: str
    ranks: int
    max_batch_size: int
    sessions: int
    slice: tuple[str, ...]


def saturated_slice(count: int = 16) -> tuple[str, ...]:
    """Held-out sessions (sim_bench's `report` half) with 3-8 turns under 32k tokens, the
    first `count` by name: short enough to replay live, enough of them to queue."""
    picked = []
    for path in session_files("report"):
        turns = [t for c in read_claude_code(path).all_conversations() for t in c.turns()]
        if 3 <= sum(t.input_tokens + t.output_tokens <= 32768 for t in turns) <= 8:
            picked.append(path.stem.removeprefix("trace_"))
    return tuple(picked[:count])


def regimes(args: argparse.Namespace) -> list[Regime]:
    saturated = Regime("saturated", 4, 2, 16, saturated_slice())
    unsaturated = Regime("unsaturated", 2, 4, 8, SLICE)
    return [saturated] if args.regime == "saturated" else [saturated, unsaturated]


def replay(spec: str, arm: str, out: Path, args: argparse.Namespace) -> dict:
    """`kvfleet replay` of the regime's slice against `spec`; its JSON measures."""
    from kvfleet.services.cli import main

    traces = [str(TRACES / f"trace_{name}.json") for name in args.slice[: args.limit]]
    # `text+http://` (peers_fleet): a router that takes the prompt as text only.
    api = "text" if spec.startswith(TEXT_SCHEME) else "completions"
    argv = [
        "replay",
        *traces,
        "--target",
        spec.removeprefix("text+"),
        "--api",
        api,
        "--arm",
        arm,
        "--json",
        str(out),
        "--sessions",
        str(args.sessions),
        "--time-scale",
        "0",
        "--seed",
        str(args.seed),
        "--stagger",
        str(args.stagger),
        "--max-model-len",
        str(args.max_model_len),
        "--vocab-size",
        str(TEXT_VOCAB),
        "--model",
        SERVED_MODEL,
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
    workdir = root / f"{args.regime_name}-{args.seed}-{args.stagger}-{name.replace(' ', '_')}"
    workdir.mkdir()
    fleet = Fleet(workdir)
    try:
        spec = ROUTERS[router](fleet, settings, args.ranks, policy)
        return replay(spec, name, workdir / "replay.json", args)
    finally:
        fleet.stop()


def spread(values: list[float], fmt: str) -> str:
    mean = format(statistics.fmean(values), fmt)
    if len(values) == 1:
        return mean
    return f"{mean} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def print_table(results: dict[str, list[dict]], regime: Regime, args) -> None:
    runs = len(next(iter(results.values()), []))
    table = Table(
        title=f"Peers, {regime.name}: {regime.ranks} sim ranks x {regime.max_batch_size} slots, "
        f"{regime.sessions} concurrent sessions, {args.kv_pages} KV pages each; mean (min-max) "
        f"of {runs} run(s) (seed:stagger {args.runs}); ratios vs {BASELINE}"
    )
    columns = ("arm", "prefix reuse", "of oracle", "later turns no reuse", "TTFT p50 s",
               "TTFT p90 s", "reuse vs base")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "arm" else "right")
    base = results.get(BASELINE)
    for name, items in results.items():
        reuse_ratio = "-"
        if base:
            base_reuse = statistics.fmean(m["prefix_reuse"] for m in base)
            reuse_ratio = f"{statistics.fmean(m['prefix_reuse'] for m in items) / base_reuse:.2f}x"
        table.add_row(
            name,
            spread([m["prefix_reuse"] for m in items], ".3f"),
            spread([m["prefix_reuse"] / max(m["oracle_reuse"], 1e-9) for m in items], ".1%"),
            spread([m["later_turns_no_reuse"] for m in items], ".1%"),
            spread([m["ttft_p50_s"] for m in items], ".3f"),
            spread([m["ttft_p90_s"] for m in items], ".3f"),
            reuse_ratio,
        )
    Console(width=180).print(table)
    first = next(iter(results.values()), [None])[0]
    if first:
        print(
            f"workload: {first['requests']} requests, {first['prompt_tokens']:,} prompt tokens "
            f"from {len(regime.slice[: args.limit])} Claude Code sessions (max_model_len "
            f"{args.max_model_len}), think time 0; sim time scale {args.sim_time_scale}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--regime", choices=("saturated", "both"), default="both")
    parser.add_argument("--runs", default="1:1,2:3", help="seed:stagger pairs, comma-separated")
    parser.add_argument("--kv-pages", type=int, default=1200, help="64-token pages per rank")
    parser.add_argument("--limit", type=int, default=None, help="sessions of the slice")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--sim-time-scale", type=float, default=0.25)
    parser.add_argument("--json", type=Path, default=None, help="write every arm's measures")
    args = parser.parse_args()
    runs = [tuple(item.split(":")) for item in args.runs.split(",")]

    tables: dict[str, dict[str, list[dict]]] = {}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kvfleet-peers-") as tmp:
        root = Path(tmp)
        model = preset("8b").with_changes(max_position=args.max_model_len + 1024)
        model_dir = write_model_dir(root / "model", model)
        for regime in regimes(args):
            settings = RankSettings(
                model_dir=model_dir,
                max_batch_size=regime.max_batch_size,
                kv_pages=args.kv_pages,
                sim_time_scale=args.sim_time_scale,
            )
            results = tables.setdefault(regime.name, {})
            for seed, stagger in runs:
                run_args = argparse.Namespace(
                    **vars(args), regime_name=regime.name, ranks=regime.ranks,
                    sessions=regime.sessions, slice=regime.slice, seed=int(seed),
                    stagger=float(stagger),
                )  # fmt: skip
                for name in args.arms:
                    router = ARMS[name][0]
                    if not router_available(router):
                        skipped[name] = f"{ROUTER_NEEDS[router]} is not installed (extra 'peers')"
                        continue
                    try:
                        measures = run_arm(name, settings, run_args, root)
                    except (RuntimeError, TimeoutError) as error:
                        skipped[name] = str(error)
                        continue
                    results.setdefault(name, []).append(measures)
            print_table(results, regime, args)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    if args.json is not None:
        args.json.write_text(json.dumps({"tables": tables, "skipped": skipped}, indent=2))


if __name__ == "__main__":
    main()
