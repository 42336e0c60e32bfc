"""What a process spent its CPU on: a py-spy speedscope file summarised per thread.

fleet_replay.py --profile-s records the router, engine 0 and the replay client with py-spy
(`--gil`: only samples where a thread holds the GIL, so a thread's seconds are its share of the
one interpreter every thread of the process shares). Per thread this prints those seconds, the
functions where the samples ended (self time), and kvfleet's own functions with everything
they called (inclusive time).

Run: .venv/bin/python bench/pyspy_top.py FILE.json... [--top 10] [--min-seconds 0.2]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

PROJECT_DIRS = ("/services/", "/kvstore/", "/proto/")


def summarise(path: Path, top: int, min_seconds: float) -> list[str]:
    data = json.loads(path.read_text())
    frames = data["shared"]["frames"]

    def label(index: int) -> str:
        frame = frames[index]
        return f"{frame['name']} ({Path(frame.get('file') or '?').name}:{frame.get('line', '')})"

    lines = []
    for profile in data["profiles"]:
        total = float(sum(profile["weights"]))
        if total < min_seconds:
            continue
        own: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
            if stack:
                own[label(stack[-1])] += weight
            for index in set(stack):
                if any(d in (frames[index].get("file") or "") for d in PROJECT_DIRS):
                    inclusive[frames[index]["name"]] += weight
        lines.append(f"== {profile['name']}: {total:.1f} s")
        lines += [f"   self {w:6.2f} s  {n}" for n, w in own.most_common(top) if w >= min_seconds]
        lines += [
            f"   incl {w:6.2f} s  {n}" for n, w in inclusive.most_common(top) if w >= min_seconds
        ]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--min-seconds", type=float, default=0.2)
    args = p.parse_args()
    for path in args.files:
        print(f"# {path}")
        print("\n".join(summarise(path, args.top, args.min_seconds)))


if __name__ == "__main__":
    main()
