"""`ipamd.sizing` is pure: no asyncio, no I/O, no engine, datastore or cloud adapters (STYLE rule 1).
Checked on the source, so it holds before import-linter's contract lists the package."""

from __future__ import annotations

import ast
from pathlib import Path

import ipamd.sizing

FORBIDDEN = (
    "asyncio",
    "socket",
    "sqlite3",
    "os",
    "io",
    "subprocess",
    "logging",
    "time",
    "datastore",
    "cloud",
    "ipamd.engine",
    "ipamd.main",
    "boto3",
    "botocore",
)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for stmt in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(stmt, ast.Import):
            names.update(alias.name for alias in stmt.names)
        elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
            names.add(stmt.module)
    return names


def test_policy_imports_nothing_impure() -> None:
    package = Path(ipamd.sizing.__file__).parent
    for path in sorted(package.glob("*.py")):
        for name in _imports(path):
            bad = [f for f in FORBIDDEN if name == f or name.startswith(f + ".")]
            assert not bad, f"{path.name} imports {name}"
