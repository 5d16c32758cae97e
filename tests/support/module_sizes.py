"""`python -m tests.support.module_sizes`: the modules past ~500 lines, for a reviewer to read.

A module that long may hold two concerns; the question is the reviewer's (is this one concern?),
and the answer is a split by concern or none, never a split to meet the count. So this is a report
`make check` prints, not a check that fails. Generated code (`_generated/`) is not written by hand
and is not counted; neither are the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ipamd", "cloud", "datastore", "bench", "chaos")
PROMPT_LINES = 500


def line_counts(root: Path) -> dict[str, int]:
    """Every hand-written module under `root`'s packages, by path relative to `root`, with its
    number of lines (as `wc -l` counts them, plus a last line without its newline)."""
    counts: dict[str, int] = {}
    for package in PACKAGES:
        for module in sorted((root / package).rglob("*.py")):
            if "_generated" in module.relative_to(root).parts:
                continue
            counts[module.relative_to(root).as_posix()] = len(module.read_bytes().splitlines())
    return counts


def long_modules(counts: dict[str, int], lines: int = PROMPT_LINES) -> list[str]:
    """`path: N lines` for each module past `lines`, longest first."""
    over = sorted(
        ((n, path) for path, n in counts.items() if n > lines), key=lambda x: (-x[0], x[1])
    )
    return [f"{path}: {n} lines" for n, path in over]


def report(counts: dict[str, int], lines: int = PROMPT_LINES) -> str:
    found = long_modules(counts, lines)
    if not found:
        return f"module sizes: none of {len(counts)} modules is past {lines} lines"
    head = f"module sizes: {len(found)} of {len(counts)} modules past {lines} lines (one concern each?)"
    return "\n".join([head, *(f"  {line}" for line in found)])


def main() -> None:
    print(report(line_counts(ROOT)), file=sys.stdout)


if __name__ == "__main__":
    main()
