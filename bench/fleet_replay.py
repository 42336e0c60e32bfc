"""A real fleet on one machine: the router and N engine ranks as separate `kvfleet` processes
sharing the GPU, one fresh fleet per arm, each replaying the same sessions through the router's
OpenAI front with `kvfleet replay`. Writes `<out>/<arm>.json` per arm and `<out>/fleet.json`
(sizes and the command lines), so fleet_sim.py can replay the same arms in the simulator.

The `sglang/cache_aware` arm puts sglang-router (extra `peers`) in front of the same ranks
instead of kvfleet's router, the prompts sent as text (`kvfleet replay --api text`).

Run (device): bench/gpu/fleet_replay.sh; locally, for the plumbing only:
  python bench/fleet_replay.py --compute-backend sim --sessions-count 2 --out /tmp/fr
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import resource
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml
from fleet_arms import ARMS, arm_slug
from fleet_sizing import kv_bytes_per_token, report_half, size_fleet
from kvfleet.kvstore.tiers.disk_key import SECRET_ENV
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.replay.text_target import TEXT_VOCAB

SHARED = Path(
    os.environ.get("KVFLEET_SHARED") or Path(__file__).resolve().parents[1] / ".." / "shared"
)
ROUTER_GRPC, RANK_PORT, ROUTER_HTTP, ROUTER_METRICS = 50051, 50052, 8000, 9400
ENGINE_METRICS = 9500  # + rank index
# What each arm's counters say about where reuse was lost (summed over labels and ranks):
# turns placed off their pin, strict's fallbacks past the wait bound, conversations whose
# retained turns were handed to the LRU for room, preemptions, pages onboarded from the host.
ROUTER_COUNTERS = tuple(
    f"kvfleet_router_{name}_total"
    for name in (
        "admissions",
        "pinned_hits",
        "deferrals",
        "deferrals_past_bound",
        "requeued_full",
        "retries",
    )
)
ENGINE_COUNTERS = tuple(
    f"kvfleet_engine_{name}_total"
    for name in ("retained_conversations_released", "preemptions", "prompt_tokens", "cached_tokens")
)
ENGINE_COUNTER_PREFIXES = ("kvfleet_engine_kv_tier_",)
KVFLEET = [sys.executable, "-m", "kvfleet.services.cli"]
# `kvfleet` with the ranks' look-ahead rule before (fleet_arms.Arm.lookahead)
LOOKAHEAD_BEFORE = [sys.executable, str(Path(__file__).resolve().parent / "lookahead_before.py")]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=Path, default=None,
                   help="a folder of traces in the shared format (default: the shared Claude "
                   "Code sessions' report half)")  # fmt: skip
    p.add_argument("--sessions-count", type=int, default=12, help="first N files of the folder")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--slots", type=int, default=2, help="max_batch_size per rank")
    p.add_argument("--step-tokens", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--model", default="1b")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--max-tokens", type=int, default=64, help="output cap per turn")
    p.add_argument("--max-turns", type=int, default=24, help="first N turns per conversation")
    p.add_argument("--gpu-share", type=float, default=0.5, help="of the working set, all GPUs")
    p.add_argument("--gpu-host-share", type=float, default=0.75, help="GPUs + hosts")
    p.add_argument("--disk-share", type=float, default=0.5,
                   help="of the working set, all ranks' disk tiers together (one shared "
                        "folder: the operator mounts one volume a fleet); 0: none")  # fmt: skip
    p.add_argument("--time-scale", type=float, default=0.0)
    p.add_argument("--stagger", type=float, default=1.0)
    p.add_argument("--compute-backend", default="torch")
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget-s", type=float, default=1e9,
                   help="whole run: an arm is skipped when the last one would not fit in what "
                   "is left, and a replay is stopped before the budget ends")  # fmt: skip
    p.add_argument("--profile-s", type=float, default=0.0,
                   help="sample the router, engine 0 and the replay client with py-spy this "
                   "long, from --profile-after-s into the replay (py-spy on PATH)")  # fmt: skip
    p.add_argument("--profile-after-s", type=float, default=60.0)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


def session_files(args: argparse.Namespace) -> list[Path]:
    if args.sessions is not None:
        return sorted(args.sessions.glob("*.json*"))[: args.sessions_count]
    folder = SHARED / "traces" / "claude_code_weka"
    return report_half(folder, args.sessions_count, args.max_model_len)


def get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.read().decode()
    except OSError:
        return None


def wait_ready(
    ranks: int, procs: list[subprocess.Popen], router_log: Path | None, limit_s: float
) -> None:
    """Until every engine answers /health and, with `router_log`, kvfleet's router has logged
    every rank's registration (its slot gauges fill only once a pass has run)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a fleet process exited during start")
        registered = router_log.read_text().count(" registered at ") if router_log else ranks
        healthy = all(get(f"http://127.0.0.1:{8101 + i}/health") is not None for i in range(ranks))
        if registered >= ranks and healthy:
            return
        time.sleep(1)
    raise RuntimeError(f"fleet not ready in {limit_s:.0f} s")


def wait_answers(url: str, proc: subprocess.Popen, limit_s: float) -> None:
    """Until `url` answers, or `proc` exits."""
    end = time.monotonic() + limit_s
    while get(url) is None:
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"{url} did not answer ({proc.args[:3]} exited {proc.poll()})")
        time.sleep(1)


def warm_up(ranks: int, vocab: int) -> None:
    """One long prompt per rank, then its continuation, straight to each engine, so the
    flash-attn JIT and compiled kernels are built before the replay's clock starts (a random
    conversation: it shares no tokens with the replay)."""
    import concurrent.futures

    def one(rank: int) -> None:
        base = [(rank * 7919 + i * 31) % (vocab - 1) + 1 for i in range(6000)]
        for prompt in (base[:4000], base):
            body = json.dumps({"model": "kvfleet", "prompt": prompt, "max_tokens": 16,
                               "ignore_eos": True, "min_tokens": 16}).encode()  # fmt: skip
            request = urllib.request.Request(
                f"http://127.0.0.1:{8101 + rank}/v1/completions", body,
                {"Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=300) as answer:
                answer.read()

    with concurrent.futures.ThreadPoolExecutor(ranks * 2) as pool:
        list(pool.map(one, [r for r in range(ranks) for _ in range(2)]))


def log_file(path: Path):
    """A process's log, left open for the child to write until it exits."""
    return path.open("w")


def start_ranks(
    args, engine_yaml: Path, logs: Path, register: bool, lookahead: str = "shipped"
) -> list[subprocess.Popen]:
    """The engine ranks; with `register`, each joins kvfleet's router at RANK_PORT."""
    command = KVFLEET if lookahead == "shipped" else LOOKAHEAD_BEFORE
    # One fleet secret, as the operator mounts one: the ranks read each other's disk-tier blocks.
    env = {**os.environ, SECRET_ENV: secrets.token_hex(32)}
    procs = []
    for i in range(args.ranks):
        # the engine appends to its step log: a draw run into the same folder starts a new one
        (logs / f"steps-engine{i}.jsonl").unlink(missing_ok=True)
        router = ["--router", f"127.0.0.1:{RANK_PORT}"] if register else []
        engine = [*command, "engine", "--host", "127.0.0.1", "--advertise-host", "127.0.0.1",
                  "--grpc-port", str(50061 + i), "--http-port", str(8101 + i),
                  "--metrics-port", str(ENGINE_METRICS + i), *router,
                  "--rank-id", f"rank-{i}", "--config", str(engine_yaml), "--model", args.model,
                  "--device", args.device, "--compute-backend", args.compute_backend,
                  "--step-log", str(logs / f"steps-engine{i}.jsonl")]  # fmt: skip
        log = log_file(logs / f"engine{i}.log")
        procs.append(subprocess.Popen(engine, stdout=log, stderr=subprocess.STDOUT, env=env))
    return procs


def start_fleet(args, arm, engine_yaml: Path, logs: Path) -> list[subprocess.Popen]:
    """The arm's router and ranks, ready to serve: [router, engine 0, engine 1, ...]."""
    if arm.sglang_policy is not None:
        return start_sglang_fleet(args, arm.sglang_policy, engine_yaml, logs)
    router = [*KVFLEET, "router", "--host", "127.0.0.1", "--grpc-port", str(ROUTER_GRPC),
              "--rank-port", str(RANK_PORT), "--http-port", str(ROUTER_HTTP),
              "--metrics-port", str(ROUTER_METRICS), "--insecure-rank-port",
              "--model", args.model, *arm.router_flags]  # fmt: skip
    procs = [
        subprocess.Popen(router, stdout=log_file(logs / "router.log"), stderr=subprocess.STDOUT)
    ]
    procs += start_ranks(args, engine_yaml, logs, register=True, lookahead=arm.lookahead)
    try:
        wait_ready(args.ranks, procs, logs / "router.log", 300)
    except RuntimeError:
        stop_fleet(procs)
        raise
    return procs


def start_sglang_fleet(args, policy: str, engine_yaml: Path, logs: Path) -> list[subprocess.Popen]:
    """Ranks that join no router, then sglang-router in front of their HTTP ports."""
    if importlib.util.find_spec("sglang_router") is None:
        raise RuntimeError("sglang-router is not installed (pip install -e '.[peers]')")
    procs = start_ranks(args, engine_yaml, logs, register=False)
    router = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
              "--port", str(ROUTER_HTTP), "--policy", policy, "--prometheus-host", "127.0.0.1",
              "--prometheus-port", str(ROUTER_METRICS), "--worker-urls",
              *(f"http://127.0.0.1:{8101 + i}" for i in range(args.ranks))]  # fmt: skip
    try:
        wait_ready(args.ranks, procs, None, 300)
        procs.insert(0, subprocess.Popen(router, stdout=log_file(logs / "router.log"),
                                         stderr=subprocess.STDOUT))  # fmt: skip
        for path in ("/health", "/v1/models"):
            wait_answers(f"http://127.0.0.1:{ROUTER_HTTP}{path}", procs[0], 120)
    except RuntimeError:
        stop_fleet(procs)
        raise
    return procs


def counter_sums(text: str, names: tuple[str, ...], prefixes: tuple[str, ...] = ()) -> dict:
    """Sum each named counter (and every counter under `prefixes`) over its labels; those
    under `prefixes` also per label set (the KV tiers' counters by tier and direction: what a
    disk read or write cost the ranks is only told apart there)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        labelled = name.endswith("_total") and name.startswith(prefixes)
        if name in names or labelled:
            key = series if name == "kvfleet_router_admissions_total" else name
            sums[key] = sums.get(key, 0.0) + float(value)
            if labelled and series != name:
                sums[series] = sums.get(series, 0.0) + float(value)
    return sums


def scrape_counters(ranks: int, logs: Path) -> dict:
    """The router's and the engines' counters at the end of an arm (texts kept in `logs`)."""
    counters: dict[str, float] = {}
    sources = [("router", ROUTER_METRICS, ROUTER_COUNTERS, ())] + [
        (f"engine{i}", ENGINE_METRICS + i, ENGINE_COUNTERS, ENGINE_COUNTER_PREFIXES)
        for i in range(ranks)
    ]
    for name, port, names, prefixes in sources:
        text = get(f"http://127.0.0.1:{port}/metrics") or ""
        (logs / f"metrics-{name}.txt").write_text(text)
        for key, value in counter_sums(text, names, prefixes).items():
            counters[key] = counters.get(key, 0.0) + value
    return counters


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a live process has used (/proc), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def histogram_means(ranks: int, logs: Path) -> dict[str, float]:
    """Mean seconds of the router's and the engines' latency histograms (sum / count over all
    ranks and labels, read from the scraped texts): exact, unlike a bucket's edge."""
    totals: dict[str, list[float]] = {}
    texts = [logs / "metrics-router.txt"] + [logs / f"metrics-engine{i}.txt" for i in range(ranks)]
    for path in texts:
        text = path.read_text() if path.exists() else ""
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            name = series.split("{", 1)[0]
            for end, slot in (("_seconds_sum", 0), ("_seconds_count", 1)):
                if name.endswith(end) and not line.startswith("#"):
                    labels = series[len(name) :]
                    key = name[: -len(end)] + labels
                    totals.setdefault(key, [0.0, 0.0])[slot] += float(value)
    return {key: s / n for key, (s, n) in sorted(totals.items()) if n}


def client_means(records: Path) -> dict[str, float]:
    """The replay client's own TTFT and inter-token gap means, from its per-request records."""
    ttfts, gaps = [], []
    for line in records.read_text().splitlines() if records.exists() else []:
        r = json.loads(line)
        if r["error"] is None and r["first_token_s"] is not None:
            ttfts.append(r["first_token_s"] - r["arrival_s"])
            times = r["token_times_s"]
            gaps.extend(b - a for a, b in itertools.pairwise(times))
    return {"client_ttft": sum(ttfts) / len(ttfts) if ttfts else 0.0,
            "client_itl": sum(gaps) / len(gaps) if gaps else 0.0}  # fmt: skip


def per_rank(records: Path) -> dict[str, dict]:
    """Per rank the router named: its conversations, prompt tokens and the share reused."""
    ranks: dict[str, dict] = {}
    for line in records.read_text().splitlines() if records.exists() else []:
        r = json.loads(line)
        if r["error"] is not None:
            continue
        rank = ranks.setdefault(r.get("rank") or "?", {"conversations": set(), "prompt": 0,
                                                        "reused": 0})  # fmt: skip
        rank["conversations"].add(r["conversation_id"].rsplit("/", 1)[-1])
        rank["prompt"] += r["prompt_tokens"]
        rank["reused"] += r["reused_tokens"]
    return {name: {"conversations": sorted(rank["conversations"]), "prompt_tokens": rank["prompt"],
                   "reused_share": rank["reused"] / rank["prompt"] if rank["prompt"] else 0.0}
            for name, rank in sorted(ranks.items())}  # fmt: skip


def start_profiles(pids: dict[str, int], seconds: float, logs: Path) -> list[subprocess.Popen]:
    """py-spy samples of the named processes (speedscope files in `logs`); none without it."""
    spy = shutil.which("py-spy")
    if spy is None or seconds <= 0:
        return []
    return [
        subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                          "--rate", "50", "--nonblocking", "--gil", "--threads",
                          "--format", "speedscope", "--output", str(logs / f"pyspy-{name}.json")],
                         stdout=log_file(logs / f"pyspy-{name}.log"), stderr=subprocess.STDOUT)
        for name, pid in pids.items()
    ]  # fmt: skip


def api_flags(arm, model: str, vocab_size: int) -> list[str]:
    """What the replay sends: token ids, or (to sglang-router, which takes no ids and lists the
    ranks' own model name) ASCII text."""
    if arm.sglang_policy is not None:
        return ["--api", "text", "--vocab-size", str(TEXT_VOCAB), "--model", model]
    return ["--vocab-size", str(vocab_size)]


def run_replay(replay: list[str], timeout_s: float, procs, args, logs: Path) -> tuple[int, dict]:
    """Run the replay client; returns its exit status and the CPU seconds the router, each
    engine and the client used during it (a process pegged near 1.0 per wall second is the
    bottleneck, whatever the GPU does)."""
    before = {f"p{i}": cpu_seconds(p.pid) or 0.0 for i, p in enumerate(procs)}
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    client = subprocess.Popen(replay)
    profiles: list[subprocess.Popen] = []
    try:
        if args.profile_s > 0:
            try:
                client.wait(timeout=min(args.profile_after_s, timeout_s))
            except subprocess.TimeoutExpired:
                names = {"router": procs[0].pid, "engine0": procs[1].pid, "client": client.pid}
                profiles = start_profiles(names, args.profile_s, logs)
        code = client.wait(timeout=max(timeout_s - (time.monotonic() - started), 1))
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        after = {f"p{i}": cpu_seconds(p.pid) or 0.0 for i, p in enumerate(procs)}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    for spy in profiles:
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
    wall = time.monotonic() - started
    names = ["router"] + [f"engine{i}" for i in range(len(procs) - 1)]
    cpu = {name: (after[f"p{i}"] - before[f"p{i}"]) / wall for i, name in enumerate(names)}
    cpu["client"] = (children.ru_utime + children.ru_stime - children_before.ru_utime
                     - children_before.ru_stime) / wall  # fmt: skip
    return code, {name: round(share, 3) for name, share in cpu.items()}


def stop_fleet(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            p.kill()


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = preset(args.model)
    per_token = kv_bytes_per_token(model.num_layers, model.num_kv_heads, model.head_dim)
    traces = session_files(args)
    sizing = size_fleet(traces, args.max_model_len, args.max_turns, per_token, args.ranks,
                        args.gpu_share, args.gpu_host_share)  # fmt: skip
    page_tokens = 16  # the engine's shipped page size
    gpu_pages = sizing.pages(sizing.gpu_gib_per_rank, page_tokens, per_token)
    # A rank refuses a turn its pool cannot hold alone: a few sessions' working set can give
    # pools smaller than their longest turn.
    need = -(-(sizing.longest_prompt_tokens + args.max_tokens) // page_tokens) + 1
    if gpu_pages < need:
        print(f"gpu pages per rank raised from {gpu_pages} to {need}: the longest turn "
              f"({sizing.longest_prompt_tokens} tokens) must fit one rank", flush=True)  # fmt: skip
        gpu_pages = need
    host_pages = sizing.pages(sizing.host_gib_per_rank, page_tokens, per_token)
    disk_gib_per_rank = sizing.working_set_gib * args.disk_share / args.ranks
    disk_pages = sizing.pages(disk_gib_per_rank, page_tokens, per_token) if args.disk_share else 0
    fleet = {"sessions": [str(t) for t in traces], "ranks": args.ranks, "slots": args.slots,
             "step_tokens": args.step_tokens, "model": args.model, "max_tokens": args.max_tokens,
             "max_turns": args.max_turns,
             "max_model_len": args.max_model_len, "time_scale": args.time_scale,
             "stagger": args.stagger, "kv_bytes_per_token": per_token,
             "working_set_tokens": sizing.working_set_tokens,
             "working_set_gib": sizing.working_set_gib,
             "gpu_gib_per_rank": gpu_pages * page_tokens * per_token / 2**30,
             "host_gib_per_rank": sizing.host_gib_per_rank, "gpu_pages_per_rank": gpu_pages,
             "host_pages_per_rank": host_pages, "page_tokens": page_tokens,
             "disk_share": args.disk_share, "disk_pages_per_rank": disk_pages,
             # what the ranks run with (their default): fleet_sim mirrors it
             "host_exclusive": EngineConfig().host_kv_exclusive, "arms": {}}  # fmt: skip
    print(json.dumps({k: v for k, v in fleet.items() if k != "sessions"}), flush=True)
    status = 0
    begun, last_arm_s = time.monotonic(), 0.0
    for name in args.arms.split(","):
        left = args.budget_s - (time.monotonic() - begun)
        if left < last_arm_s:
            print(f"arm {name}: skipped, {left:.0f} s left, the last arm took {last_arm_s:.0f}",
                  flush=True)  # fmt: skip
            continue
        arm = ARMS[name]
        slug = arm_slug(name)
        logs = args.out / slug
        logs.mkdir(exist_ok=True)
        engine_yaml = logs / "engine.yaml"
        # The fleet's KV bytes per rank are fixed: a one-byte (fp8) cache holds twice the pages.
        per_byte = 2 if arm.engine.get("kv_cache_dtype") == "fp8_e4m3" else 1
        settings = {"max_batch_size": args.slots, "max_num_batched_tokens": args.step_tokens,
                    "kv_pages": gpu_pages * per_byte, "host_kv_pages": host_pages * per_byte,
                    **arm.engine}  # fmt: skip
        # Every arm starts on an empty disk tier, as on empty GPUs and hosts.
        disk = args.out / "disk-tier" / slug
        if disk_pages:
            shutil.rmtree(disk, ignore_errors=True)
            disk.mkdir(parents=True)
            settings |= {"disk_tier_dir": str(disk), "disk_kv_pages": disk_pages * per_byte}
        engine_yaml.write_text(yaml.safe_dump({"engine": settings}))
        started = time.monotonic()
        procs: list[subprocess.Popen] = []
        try:
            procs = start_fleet(args, arm, engine_yaml, logs)
            warm_up(args.ranks, model.vocab_size)
            ready_s = time.monotonic() - started
            replay = [*KVFLEET, "replay", *map(str, traces), "--target",
                      f"http://127.0.0.1:{ROUTER_HTTP}/v1", "--arm", name,
                      "--json", str(args.out / f"{slug}.json"), "--sessions", str(len(traces)),
                      "--time-scale", str(args.time_scale), "--stagger", str(args.stagger),
                      "--max-model-len", str(args.max_model_len), "--max-tokens",
                      str(args.max_tokens), "--max-turns", str(args.max_turns),
                      *api_flags(arm, args.model, model.vocab_size),
                      "--records", str(logs / "records.jsonl"), "--no-progress"]  # fmt: skip
            # Stop in time to stop the fleet (<= 40 s) and write what was measured.
            left = args.budget_s - (time.monotonic() - begun) - 45
            code, cpu = run_replay(replay, max(left, 1), procs, args, logs)
            status = status or code
            counters = scrape_counters(args.ranks, logs)
            means = {**histogram_means(args.ranks, logs), **client_means(logs / "records.jsonl")}
            fleet["arms"][name] = {"ready_s": ready_s, "replay_rc": code,
                                   "replay_s": time.monotonic() - started - ready_s,
                                   "counters": counters, "cpu_per_wall_s": cpu,
                                   "mean_s": means,
                                   "per_rank": per_rank(logs / "records.jsonl")}  # fmt: skip
            for key in ("counters", "cpu_per_wall_s", "mean_s", "per_rank"):
                print(f"arm {name} {key}: {json.dumps(fleet['arms'][name][key])}", flush=True)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as error:
            print(f"arm {name}: {error}", flush=True)
            fleet["arms"][name] = {"error": str(error)}
            status = 1
        finally:
            stop_fleet(procs)
            shutil.rmtree(disk, ignore_errors=True)  # the next arm's room on the machine's disk
            last_arm_s = time.monotonic() - started
        (args.out / "fleet.json").write_text(json.dumps(fleet, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
