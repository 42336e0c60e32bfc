"""The replay table: one row per measure, one column per arm."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

from .measures import MEASURE_FIELDS, ReplayMeasures

# How each measure is shown; fractions as percentages, latencies in milliseconds.
_FORMATS: dict[str, str] = {
    "prefix_reuse": "percent",
    "oracle_reuse": "percent",
    "later_turns_no_reuse": "percent",
    "req_per_s": "rate",
    "output_tok_per_s": "rate",
    "ttft_p50_s": "millis",
    "ttft_p90_s": "millis",
    "itl_p90_s": "millis",
    "duration_s": "seconds",
}

_FORMATTERS = {
    "percent": lambda v: f"{100 * v:.1f} %",
    "rate": lambda v: f"{v:.2f}",
    "millis": lambda v: f"{1000 * v:.1f} ms",
    "seconds": lambda v: f"{v:.1f} s",
    "count": lambda v: f"{v:,}",
}


def format_value(name: str, value: float | int | None) -> str:
    """A measure's value as the table shows it."""
    if value is None:
        return "-"
    return _FORMATTERS[_FORMATS.get(name, "count")](value)


def build_table(arms: Mapping[str, ReplayMeasures], title: str = "kvfleet replay") -> Table:
    """A rich table of every measure for every arm, with reuse as a share of the oracle."""
    table = Table(title=title)
    table.add_column("measure")
    for arm in arms:
        table.add_column(arm, justify="right")
    for name in MEASURE_FIELDS:
        table.add_row(name, *(format_value(name, getattr(m, name)) for m in arms.values()))
    table.add_row(
        "reuse / oracle",
        *(
            format_value("prefix_reuse", m.prefix_reuse / m.oracle_reuse if m.oracle_reuse else 0)
            for m in arms.values()
        ),
    )
    return table


def print_report(arms: Mapping[str, ReplayMeasures], console: Console | None = None) -> None:
    """Print the replay table."""
    (console or Console()).print(build_table(arms))
