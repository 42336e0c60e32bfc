"""Where a later turn's time to first token goes: before its first prefill chunk, and after.

Reads runs, each a folder with the replay's records (`records.jsonl[.xz]`, `kvfleet replay
--records`) and its ranks' step logs (`steps-engine<i>.jsonl[.xz]` of a fleet replay, or the
simulator's `steps-rank-<i>.jsonl`). Each later turn is found on its rank's log: its first
chunk is the prefill span that starts at its reused tokens, its last the one that ends at its
prompt; the log's clock is set to the records' by the median of (last chunk's end - first
token). Per run:

| column              | what                                                                   |
|---------------------|------------------------------------------------------------------------|
| wait                | arrival at the router -> its first chunk starts: the router's deferral, |
|                     | the dispatch, the rank's queue, its admission and its pieces            |
| chunks              | first chunk's start -> first token: its prefill (and the steps between) |
| waited over 0.5 s   | turns whose wait was longer; on their rank during the wait, the median  |
|                     | steps that brought pieces up (host/disk pages, no prefill) and pages    |
|                     | onboarded                                                               |
| pages onboarded     | host / disk pages the run's steps brought to the device                |

`--sim YAML --hw FOLDER` first replays the hardware run's fleet (its `fleet.json`, the arm
named by `--arm`) through the simulator at the run's stagger, keeping its records and step
logs in a temporary folder, and reads it as one more run (`--hardware k=v,...` as in
bench/fleet_sim.py).

    .venv/bin/python bench/turn_waits.py bench/gpu/h100_fleet_replay_ahead/steps/{defaults,draw2} \\
        --sim bench/gpu/sim_1b_h100_chip.yaml --hw bench/gpu/h100_fleet_replay_ahead
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from fleet_sim import sim_replay
from gpu_common import print_table
from sim_yaml import with_hardware_figures
from step_costs import read_log, steps_of

SHARED = Path(__file__).resolve().parents[2] / "shared"
LONG_WAIT_S = 0.5


def records_of(folder: Path) -> list[dict]:
    path = next(folder.glob("records.jsonl*"))
    return [json.loads(line) for line in read_log(path).splitlines() if line.strip()]


def rank_logs(folder: Path) -> dict[str, list[dict]]:
    """Rank name (the records' `rank-<i>`) -> its steps."""
    logs = {}
    for path in sorted(folder.glob("steps-*.jsonl*")):
        index = path.name.split(".")[0].rsplit("-", 1)[1].removeprefix("engine")
        logs[f"rank-{index}"] = steps_of(path)
    return logs


def chunks_of(record: dict, steps: list[dict]) -> tuple[dict, dict] | None:
    """The steps of a turn's first and last prefill chunk, or None where the log has none."""
    start, end = record["reused_tokens"], record["prompt_tokens"]
    first = None
    for step in steps:
        for a, b in step["prefill"]:
            if first is None and a == start and b <= end:
                first = step
            if first is not None and b == end:
                return first, step
    return None


def turn_rows(folder: Path) -> tuple[list[tuple[float, float, int, int]], tuple[int, int]]:
    """Per later turn found: (wait s, chunks s, piece steps and pages onboarded on its rank
    during the wait); and the run's host / disk pages onboarded."""
    logs = rank_logs(folder)
    found = []
    for record in records_of(folder):
        if record["turn_index"] == 0 or record.get("error") or record["rank"] not in logs:
            continue  # a first turn, or a request that failed (no rank, no first token)
        if chunks := chunks_of(record, logs[record["rank"]]):
            found.append((record, *chunks))
    offset = float(np.median([last["t"] + last["s"] - r["first_token_s"] for r, _, last in found]))
    rows = []
    for record, first, _ in found:
        start = first["t"] - offset
        wait = start - record["arrival_s"]
        during = [s for s in logs[record["rank"]] if first["t"] - wait <= s["t"] < first["t"]]
        pieces = sum(1 for s in during if (s["host_in"] or s["disk_in"]) and not s["prefill"])
        pages = sum(s["host_in"] + s["disk_in"] for s in during)
        rows.append((wait, record["first_token_s"] - start, pieces, pages))
    every = [step for steps in logs.values() for step in steps]
    onboarded = (sum(s["host_in"] for s in every), sum(s["disk_in"] for s in every))
    return rows, onboarded


def simulated(args: argparse.Namespace, folder: Path) -> Path:
    """The hardware run's fleet replayed through the simulator; its folder."""
    fleet = json.loads((args.hw / "fleet.json").read_text())
    sim = with_hardware_figures(args.sim, args.hardware, folder)
    records = ["--records", str(folder / "records.jsonl")]
    sim_replay(sim, fleet, args.arm, args.sessions, records, step_log=folder)
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="*", help="folders: records + step logs")
    p.add_argument("--sim", type=Path, help="a simulator YAML to replay the --hw fleet with")
    p.add_argument("--hw", type=Path, help="the hardware replay folder (fleet.json)")
    p.add_argument("--arm", default="defaults")
    p.add_argument("--hardware", default="", help="k=v,... over the YAML's hardware figures")
    p.add_argument("--sessions", type=Path, default=SHARED / "traces" / "claude_code_weka")
    args = p.parse_args()
    runs = [(str(run), run) for run in args.runs]
    with tempfile.TemporaryDirectory(prefix="turn-waits-") as scratch:
        if args.sim is not None:
            if args.hw is None:
                p.error("--sim needs --hw (the fleet to replay)")
            runs.append((f"simulator, {args.sim.name}", simulated(args, Path(scratch))))
        table = []
        for name, folder in runs:
            rows, (host, disk) = turn_rows(folder)
            r = np.array(rows)
            long = r[r[:, 0] > LONG_WAIT_S]
            table.append([
                name, len(r),
                f"{np.median(r[:, 0]):.2f} / {np.percentile(r[:, 0], 90):.2f}",
                f"{np.median(r[:, 1]):.2f} / {np.percentile(r[:, 1], 90):.2f}",
                f"{len(long)}: {np.median(long[:, 2]):.0f} / {np.median(long[:, 3]):.0f}"
                if len(long) else "0",
                f"{host:,} / {disk:,}",
            ])  # fmt: skip
    print_table(
        "later turns: arrival -> first chunk (wait) -> first token (chunks)",
        ["run", "turns", "wait p50 / p90 s", "chunks p50 / p90 s",
         f"waited over {LONG_WAIT_S} s: turns: piece steps / pages, p50",
         "pages onboarded host / disk"],
        table,
    )  # fmt: skip


if __name__ == "__main__":
    main()
