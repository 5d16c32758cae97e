"""No module of ipamd, the cloud, the datastore, the benches or the chaos runner runs past 500 lines:
a module longer than that likely holds more than one concern a newcomer must keep in mind at once,
and is split by concern (never to meet the count). Generated code (`_generated/`) is not written by
hand and is not counted; neither are the tests."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ipamd", "cloud", "datastore", "bench", "chaos")
MAX_LINES = 500


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


def over_budget(counts: dict[str, int]) -> list[str]:
    return [f"{path}: {n} lines" for path, n in sorted(counts.items()) if n > MAX_LINES]


def test_no_module_is_over_budget() -> None:
    counts = line_counts(ROOT)
    assert "ipamd/main.py" in counts, "the walk finds the daemon's modules"
    assert not any("_generated" in path for path in counts), "generated code is not counted"
    offenders = over_budget(counts)
    assert not offenders, f"modules over {MAX_LINES} lines (split or tighten them): {offenders}"


def test_a_module_over_budget_is_named_with_its_length(tmp_path: Path) -> None:
    (tmp_path / "ipamd" / "runtime" / "_generated").mkdir(parents=True)
    (tmp_path / "cloud").mkdir()
    (tmp_path / "ipamd" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "ipamd" / "full.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "cloud" / "unended.py").write_text("x = 1\n" * MAX_LINES + "y = 2")
    (tmp_path / "ipamd" / "runtime" / "_generated" / "pb2.py").write_text("x = 1\n" * 900)
    counts = line_counts(tmp_path)
    over, full = MAX_LINES + 1, MAX_LINES
    assert counts == {"cloud/unended.py": over, "ipamd/full.py": full, "ipamd/long.py": over}
    assert over_budget(counts) == [
        f"cloud/unended.py: {over} lines",
        f"ipamd/long.py: {over} lines",
    ]
