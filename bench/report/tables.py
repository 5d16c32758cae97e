"""The report's markdown pieces that every section of docs/benchmarks.md uses: tables, numbers as
the page shows them, a figure against its target, and a plot's link."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def runs_table(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """Every figure of every run: a row per figure, a column per run (by name)."""
    names = sorted(runs)
    metrics = sorted({m for run in runs.values() for m in run})
    return table(("figure", *names), [(m, *(num(runs[r].get(m)) for r in names)) for m in metrics])


def verdict(value: float | None, bound: float) -> str:
    if value is None:
        return ""
    return f"≤ {num(bound)} ({'met' if value <= bound else 'NOT met'})"


def image(plots: Mapping[str, str], name: str, alt: str) -> str:
    path = plots.get(name)
    return f"![{alt}]({path})" if path else f"_{alt}: no data in this run._"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def num(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3f}"
