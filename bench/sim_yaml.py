"""A simulator YAML with some hardware figures changed, for the benches' `--hardware k=v,...`."""

from __future__ import annotations

from pathlib import Path

import yaml


def with_hardware_figures(sim_yaml: Path, figures: str, folder: Path) -> Path:
    """`sim_yaml` with the figures `k=v,k=v` over its hardware section, written in `folder`
    (`sim_yaml` itself when there are none). Raises ValueError naming an item without `=` or
    whose value is not a number; an unknown figure is refused when the simulator loads it."""
    if not figures:
        return sim_yaml
    changed = {}
    for item in figures.split(","):
        key, _, text = item.partition("=")
        try:
            changed[key.strip()] = float(text)  # no `=`: float("") refuses it too
        except ValueError:
            raise ValueError(f"--hardware: {item!r} is not k=NUMBER") from None
    raw = yaml.safe_load(sim_yaml.read_text()) or {}
    raw["hardware"] = {**raw.get("hardware", {}), **changed}
    merged = folder / f"{sim_yaml.stem}-hardware.yaml"
    merged.write_text(yaml.safe_dump(raw))
    return merged
