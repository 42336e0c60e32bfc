"""The simulator on the sessions and fleet of a hardware fleet replay (fleet_replay.py), and
the table hardware vs simulator per arm.

Reads `<hw>/fleet.json` (sizes, sessions) and `<hw>/<arm>.json` (and `<hw>/draw*/<arm>.json`,
further draws of the arm); runs each arm through `kvfleet replay --target sim:YAML?...` with
the same ranks, slots, step budget, KV bytes per rank and router/kvstore settings
(fleet_arms.py); prints a Markdown table. A replay whose placement is decided by timing moves
a lot from one run to the next, on hardware as in the simulator: `--staggers` runs the
simulator once per start stagger and each cell gives the mean (min-max) of the draws and of
the simulator's runs, and the gap of the means.

Run: .venv/bin/python bench/fleet_sim.py --hw DIR [DIR...] [--sim bench/gpu/sim_1b_h200_shared.yaml]
     [--hardware admit_ms_per_host_page=0.178,admit_ms_per_disk_page=1.14]
     [--sessions DIR] [--out DIR] [--arms defaults,lenient/t2] [--staggers 0.5,1,1.5,2]
     [--jobs 2] [--step-logs]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fleet_arms import ARMS, arm_slug
from fleet_replay import SHARED
from sim_yaml import with_hardware_figures

HERE = Path(__file__).resolve().parent
# name, key, format; the comparison is the simulator's relative gap to hardware.
METRICS = (
    ("reuse / oracle", "reuse_over_oracle", "{:.3f}"),
    ("later turns no reuse", "later_turns_no_reuse", "{:.1%}"),
    ("TTFT p50 s", "ttft_p50_s", "{:.2f}"),
    ("TTFT p90 s", "ttft_p90_s", "{:.2f}"),
    ("output tok/s", "output_tok_per_s", "{:.0f}"),
    ("ITL p90 ms", "itl_p90_ms", "{:.0f}"),
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hw", type=Path, nargs="+", required=True,
                   help="fleet_replay.py's output folder; more folders of the same fleet add "
                        "their draws")  # fmt: skip
    p.add_argument("--sim", type=Path, default=HERE / "gpu" / "sim_1b_h200_shared.yaml")
    p.add_argument("--hardware", default="",
                   help="hardware figures over --sim's: k=v,k=v")  # fmt: skip
    p.add_argument("--sessions", type=Path, default=SHARED / "traces" / "claude_code_weka",
                   help="where the fleet's session files are here")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="sim JSON (default: --hw)")
    p.add_argument("--arms", default=None, help="comma-separated (default: fleet.json's)")
    p.add_argument("--staggers", default=None, help="comma-separated (default: the fleet's)")
    p.add_argument("--jobs", type=int, default=1, help="simulator runs at once")
    p.add_argument("--step-logs", action="store_true",
                   help="each run's ranks log their steps in OUT/steps/<arm>-<stagger>/ "
                        "(bench/step_mix.py)")  # fmt: skip
    return p.parse_args()


def sim_target(yaml_path: Path, fleet: dict, arm: str) -> str:
    # block_size: the engine's page, so both kvstores hash, keep and evict the same pages.
    options = {"ranks": fleet["ranks"], "slots": fleet["slots"], "block_size": fleet["page_tokens"],
               "chunk_tokens": fleet["step_tokens"], "max_context_tokens": fleet["max_model_len"],
               "gpu_gib": f"{fleet['gpu_gib_per_rank']:.4f}",
               "host_gib": f"{fleet['host_gib_per_rank']:.4f}",
               # replays recorded before the fleet had a disk tier have none
               "disk_pages": fleet.get("disk_pages_per_rank", 0),
               "retained_conversations": fleet["slots"],
               # replays recorded before the engine's host tier was exclusive kept copies
               "host_exclusive": str(fleet.get("host_exclusive", False)).lower(),
               **ARMS[arm].sim}  # fmt: skip
    return f"sim:{yaml_path}?" + "&".join(f"{k}={v}" for k, v in options.items())


def sim_replay(
    sim: Path,
    fleet: dict,
    arm: str,
    sessions_dir: Path,
    outputs: list[str],
    step_log: Path | None = None,
    stagger: float | None = None,
) -> None:
    """The hardware fleet's sessions and arm replayed through the simulator YAML `sim`,
    writing `outputs` (replay flags: `--json PATH`, `--records PATH`) and, given a folder,
    its step logs."""
    sessions = [sessions_dir / Path(s).name for s in fleet["sessions"]]
    target = sim_target(sim, fleet, arm)
    if step_log is not None:
        target += f"&step_log={step_log}"
    command = [sys.executable, "-m", "kvfleet.services.cli", "replay", *map(str, sessions),
               "--target", target, "--arm", arm, *outputs,
               "--sessions", str(len(sessions)), "--time-scale", str(fleet["time_scale"]),
               "--stagger", str(fleet["stagger"] if stagger is None else stagger),
               "--max-model-len", str(fleet["max_model_len"]),
               "--max-tokens", str(fleet["max_tokens"]), "--max-turns", str(fleet["max_turns"]),
               "--no-progress"]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def run_sim(
    args: argparse.Namespace, fleet: dict, arm: str, out: Path, stagger: float | None = None
) -> dict:
    steps = out.parent / "steps" / out.stem.removeprefix("sim_") if args.step_logs else None
    sim_replay(args.sim, fleet, arm, args.sessions, ["--json", str(out)], steps, stagger)
    return json.loads(out.read_text())


def value(measures: dict, key: str) -> float | None:
    if key == "reuse_over_oracle":
        return measures["prefix_reuse"] / measures["oracle_reuse"]
    if key == "itl_p90_ms":
        return 1e3 * measures["itl_p90_s"] if "itl_p90_s" in measures else None
    return measures.get(key)


def sizes(fleet: dict) -> dict:
    """What makes two fleet replays the same fleet: all but their arms and placements."""
    return {key: value for key, value in fleet.items() if key not in ("arms", "per_rank")}


def cell(fmt: str, values: list[float]) -> str:
    """One value, or the mean (min-max) of several."""
    if len(values) == 1:
        return fmt.format(values[0])
    mean = fmt.format(statistics.mean(values))
    return f"{mean} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def table(rows: dict[str, tuple[list[dict], list[dict]]]) -> str:
    lines = ["| arm | " + " | ".join(f"{name} hw / sim (gap)" for name, _, _ in METRICS) + " |",
             "|---|" + "---|" * len(METRICS)]  # fmt: skip
    for arm, (hw, sim) in rows.items():
        cells = []
        for _, key, fmt in METRICS:
            a = [v for v in (value(m, key) for m in hw) if v is not None]
            b = [v for v in (value(m, key) for m in sim) if v is not None]
            if not a or not b:
                cells.append("-")
                continue
            mean_a, mean_b = statistics.mean(a), statistics.mean(b)
            gap = f"{(mean_b - mean_a) / mean_a:+.1%}" if mean_a else "n/a"
            cells.append(f"{cell(fmt, a)} / {cell(fmt, b)} ({gap})")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    fleet = json.loads((args.hw[0] / "fleet.json").read_text())
    for other in args.hw[1:]:
        if sizes(json.loads((other / "fleet.json").read_text())) != sizes(fleet):
            raise SystemExit(f"{other}: not the fleet of {args.hw[0]}")
    out = args.out or args.hw[0]
    out.mkdir(parents=True, exist_ok=True)
    try:  # the merged YAML stays beside the runs' results
        args.sim = with_hardware_figures(args.sim, args.hardware, out)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    arms = args.arms.split(",") if args.arms else list(fleet["arms"])
    staggers = [float(s) for s in args.staggers.split(",")] if args.staggers else [None]
    draws = {}
    for arm in arms:
        name = f"{arm_slug(arm)}.json"
        found = [path for hw in args.hw for path in (hw / name, *sorted(hw.glob(f"draw*/{name}")))]
        draws[arm] = [json.loads(path.read_text()) for path in found if path.is_file()]
        if not draws[arm]:
            print(f"{arm}: no hardware measures, skipped", file=sys.stderr)
    wanted = [(arm, stagger) for arm in arms if draws[arm] for stagger in staggers]

    def sim_json(arm: str, stagger: float | None) -> Path:
        return out / f"sim_{arm_slug(arm)}{'' if stagger is None else f'-{stagger}'}.json"

    with ThreadPoolExecutor(args.jobs) as pool:
        runs = {(arm, stagger): pool.submit(run_sim, args, fleet, arm, sim_json(arm, stagger),
                                            stagger)
                for arm, stagger in wanted}  # fmt: skip
        sims = {key: run.result() for key, run in runs.items()}
    rows = {arm: (draws[arm], [sims[arm, stagger] for stagger in staggers])
            for arm in arms if draws[arm]}  # fmt: skip
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
