"""The module-size report (`tests.support.module_sizes`, printed by `make check`): which modules
are past ~500 lines, for a reviewer to ask whether each holds one concern. A prompt, not a wall:
nothing fails on a module's length; the report itself is checked on samples and on the tree."""

from __future__ import annotations

from pathlib import Path

from tests.support.module_sizes import PROMPT_LINES, ROOT, line_counts, long_modules, report


def test_the_report_walks_the_packages_and_not_generated_code() -> None:
    counts = line_counts(ROOT)
    assert "ipamd/main.py" in counts, "the walk finds the daemon's modules"
    assert "cloud/ec2.py" in counts and "bench/__main__.py" in counts
    assert not any("_generated" in path for path in counts), "generated code is not counted"
    assert report(counts).startswith("module sizes: ")


def test_a_long_module_is_named_with_its_length_longest_first(tmp_path: Path) -> None:
    (tmp_path / "ipamd" / "runtime" / "_generated").mkdir(parents=True)
    (tmp_path / "cloud").mkdir()
    (tmp_path / "ipamd" / "long.py").write_text("x = 1\n" * (PROMPT_LINES + 1))
    (tmp_path / "ipamd" / "longer.py").write_text("x = 1\n" * (PROMPT_LINES + 7))
    (tmp_path / "ipamd" / "full.py").write_text("x = 1\n" * PROMPT_LINES)
    (tmp_path / "cloud" / "unended.py").write_text("x = 1\n" * PROMPT_LINES + "y = 2")
    (tmp_path / "ipamd" / "runtime" / "_generated" / "pb2.py").write_text("x = 1\n" * 900)
    counts = line_counts(tmp_path)
    over = PROMPT_LINES + 1
    assert counts == {
        "cloud/unended.py": over,
        "ipamd/full.py": PROMPT_LINES,
        "ipamd/long.py": over,
        "ipamd/longer.py": PROMPT_LINES + 7,
    }
    assert long_modules(counts) == [
        f"ipamd/longer.py: {PROMPT_LINES + 7} lines",
        f"cloud/unended.py: {over} lines",
        f"ipamd/long.py: {over} lines",
    ]
    assert report(counts).splitlines() == [
        f"module sizes: 3 of 4 modules past {PROMPT_LINES} lines (one concern each?)",
        f"  ipamd/longer.py: {PROMPT_LINES + 7} lines",
        f"  cloud/unended.py: {over} lines",
        f"  ipamd/long.py: {over} lines",
    ]


def test_none_past_the_prompt_says_so(tmp_path: Path) -> None:
    (tmp_path / "ipamd").mkdir()
    (tmp_path / "ipamd" / "short.py").write_text("x = 1\n")
    assert report(line_counts(tmp_path)) == (
        f"module sizes: none of 1 modules is past {PROMPT_LINES} lines"
    )
