"""The settings object (`ipamd.config.settings.Config`) is read only where a node is composed: its
module is imported by `ipamd/main.py`, the modules of `ipamd/node/` and the configuration package
itself, and by nothing else of ipamd. Every other part receives the values it uses (a settings
group of its own, such as `KubeSettings`, `PoolParams`, `EngineParams`, or plain arguments).
Read from the source, every import counted (under `TYPE_CHECKING` and in functions too); the
check is itself tested on samples."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = "ipamd.config.settings"
COMPOSERS = ("ipamd/main.py", "ipamd/node/", "ipamd/config/")
"""Where the settings object may be read: `ipamd run`, the node's composition, its own package."""


def importers(root: Path, module: str, files: Iterable[Path]) -> list[str]:
    """The files (relative to `root`) that import `module` or a name from it."""
    found: list[str] = []
    package, _, leaf = module.rpartition(".")
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == module or n.startswith(module + ".") for n in names) or (
                isinstance(node, ast.ImportFrom)
                and node.module == package
                and any(a.name == leaf for a in node.names)
            ):
                found.append(path.relative_to(root).as_posix())
                break
    return sorted(found)


def outside(paths: Iterable[str]) -> list[str]:
    return [p for p in paths if not p.startswith(COMPOSERS)]


def test_only_the_composition_reads_the_settings_object() -> None:
    files = [p for p in (ROOT / "ipamd").rglob("*.py") if "_generated" not in p.parts]
    found = importers(ROOT, SETTINGS, files)
    assert "ipamd/node/compose.py" in found, "the check sees the composition root's import"
    assert outside(found) == [], "hand the part a settings group of its own instead"


def test_the_check_finds_every_way_of_importing_it(tmp_path: Path) -> None:
    samples = {
        "ipamd/node/compose.py": "from ipamd.config.settings import Config\n",
        "ipamd/pool/a.py": "import ipamd.config.settings\n",
        "ipamd/pool/b.py": "from ipamd.config import settings\n",
        "ipamd/kube/c.py": "def f():\n    from ipamd.config.settings import Config\n",
        "ipamd/kube/d.py": "from ipamd.config.kinds import Taint\n",
        "ipamd/config/kinds.py": "from ipamd.config.settings import SETTINGS\n",
    }
    for name, text in samples.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = importers(tmp_path, SETTINGS, sorted(tmp_path.rglob("*.py")))
    assert outside(found) == ["ipamd/kube/c.py", "ipamd/pool/a.py", "ipamd/pool/b.py"]
