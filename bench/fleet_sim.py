"""The simulator on the sessions and fleet of a hardware fleet replay (fleet_replay.py), and
the table hardware vs simulator per arm.

Reads `<hw>/fleet.json` (sizes, sessions) and `<hw>/<arm>.json`; runs each arm through
`kvfleet replay --target sim:YAML?...` with the same ranks, slots, step budget, KV bytes per
rank and router/kvstore settings (fleet_arms.py); prints a Markdown table.

Run: .venv/bin/python bench/fleet_sim.py --hw DIR [--sim bench/gpu/sim_1b_h200_shared.yaml]
     [--sessions DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from fleet_arms import ARMS
from fleet_replay import SHARED

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
    p.add_argument("--hw", type=Path, required=True, help="fleet_replay.py's output folder")
    p.add_argument("--sim", type=Path, default=HERE / "gpu" / "sim_1b_h200_shared.yaml")
    p.add_argument("--sessions", type=Path, default=SHARED / "traces" / "claude_code_weka",
                   help="where the fleet's session files are here")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="sim JSON (default: --hw)")
    return p.parse_args()


def sim_target(yaml_path: Path, fleet: dict, arm: str) -> str:
    # block_size: the engine's page, so both kvstores hash, keep and evict the same pages.
    options = {"ranks": fleet["ranks"], "slots": fleet["slots"], "block_size": fleet["page_tokens"],
               "chunk_tokens": fleet["step_tokens"], "max_context_tokens": fleet["max_model_len"],
               "gpu_gib": f"{fleet['gpu_gib_per_rank']:.4f}",
               "host_gib": f"{fleet['host_gib_per_rank']:.4f}",
               "retained_conversations": fleet["slots"],
               # replays recorded before the engine's host tier was exclusive kept copies
               "host_exclusive": str(fleet.get("host_exclusive", False)).lower(),
               **ARMS[arm].sim}  # fmt: skip
    return f"sim:{yaml_path}?" + "&".join(f"{k}={v}" for k, v in options.items())


def run_sim(args: argparse.Namespace, fleet: dict, arm: str, out: Path) -> dict:
    sessions = [args.sessions / Path(s).name for s in fleet["sessions"]]
    command = [sys.executable, "-m", "kvfleet.services.cli", "replay", *map(str, sessions),
               "--target", sim_target(args.sim, fleet, arm), "--arm", arm, "--json", str(out),
               "--sessions", str(len(sessions)), "--time-scale", str(fleet["time_scale"]),
               "--stagger", str(fleet["stagger"]), "--max-model-len", str(fleet["max_model_len"]),
               "--max-tokens", str(fleet["max_tokens"]), "--max-turns", str(fleet["max_turns"]),
               "--no-progress"]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def value(measures: dict, key: str) -> float | None:
    if key == "reuse_over_oracle":
        return measures["prefix_reuse"] / measures["oracle_reuse"]
    if key == "itl_p90_ms":
        return 1e3 * measures["itl_p90_s"] if "itl_p90_s" in measures else None
    return measures.get(key)


def table(rows: dict[str, tuple[dict, dict]]) -> str:
    lines = ["| arm | " + " | ".join(f"{name} hw / sim (gap)" for name, _, _ in METRICS) + " |",
             "|---|" + "---|" * len(METRICS)]  # fmt: skip
    for arm, (hw, sim) in rows.items():
        cells = []
        for _, key, fmt in METRICS:
            a, b = value(hw, key), value(sim, key)
            if a is None or b is None:
                cells.append("-")
                continue
            gap = f"{(b - a) / a:+.1%}" if a else "n/a"
            cells.append(f"{fmt.format(a)} / {fmt.format(b)} ({gap})")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    fleet = json.loads((args.hw / "fleet.json").read_text())
    out = args.out or args.hw
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for arm in fleet["arms"]:
        hw_json = args.hw / f"{arm.replace('/', '_')}.json"
        if not hw_json.is_file():
            print(f"{arm}: no hardware measures, skipped", file=sys.stderr)
            continue
        sim = run_sim(args, fleet, arm, out / f"sim_{arm.replace('/', '_')}.json")
        rows[arm] = (json.loads(hw_json.read_text()), sim)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
