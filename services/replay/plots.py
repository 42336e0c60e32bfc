"""PNG plots of a replay: prefix reuse per 5-minute window and the TTFT CDF, a line per arm."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .measures import reuse_by_window
from .records import RequestRecord

REUSE_WINDOW_S = 300.0
REUSE_PLOT = "prefix_reuse_per_window.png"
TTFT_PLOT = "ttft_cdf.png"


def write_plots(arms: Mapping[str, Sequence[RequestRecord]], directory: Path) -> list[Path]:
    """Write both plots into `directory` (created if missing); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / REUSE_PLOT, directory / TTFT_PLOT]

    figure, axes = pyplot.subplots(figsize=(8, 4.5))
    for arm, records in arms.items():
        points = reuse_by_window(records, REUSE_WINDOW_S)
        axes.plot(
            [start / 60 for start, _ in points], [reuse for _, reuse in points], "o-", label=arm
        )
    axes.set(xlabel="minutes since start", ylabel="prefix reuse", ylim=(0, 1.02))
    axes.set_title(f"Prefix reuse per {REUSE_WINDOW_S / 60:.0f}-minute window")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(paths[0], dpi=120)
    pyplot.close(figure)

    figure, axes = pyplot.subplots(figsize=(8, 4.5))
    for arm, records in arms.items():
        ttfts = sorted(r.ttft_s for r in records if r.ok and r.ttft_s is not None)
        shares = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
        axes.step(ttfts, shares, where="post", label=arm)
    axes.set(xlabel="TTFT (s)", ylabel="share of requests", ylim=(0, 1.02))
    axes.set_title("TTFT CDF")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(paths[1], dpi=120)
    pyplot.close(figure)
    return paths
