"""No import circles in the daemon's packages: a test over the import graph read from the source
(every `import` and `from ... import`, those under `if TYPE_CHECKING:` and inside functions too,
since a circle of types is a circle of design), not by eye. It is itself tested on samples."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("ipamd", "cloud", "datastore", "bench", "chaos")


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "_generated" in path.parts:
                continue  # protoc's output
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _known(name: str, known: Mapping[str, Path]) -> str:
    """`name` or its nearest enclosing module of `known` ("" when none is)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def import_graph(known: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of `known` it imports (a package's `__init__` stands for the package)."""
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
            for target in targets:
                found = _known(target, known)
                if found and found != name:
                    graph[name].add(found)
    return graph


def reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that each import every other, directly or not (the
    strongly connected components), each sorted."""
    reach = {node: reachable(graph, node) for node in graph}
    found: set[tuple[str, ...]] = set()
    for node in graph:
        members = {node} | {other for other in reach[node] if node in reach[other]}
        if len(members) > 1:
            found.add(tuple(sorted(members)))
    return sorted(list(group) for group in found)


def test_the_packages_have_no_import_circle() -> None:
    known = modules(ROOT, PACKAGES)
    assert "ipamd.cni.plugin" in known and "ipamd.kube.kube_node" in known
    assert circles(import_graph(known)) == []


def _tree(root: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules(root, ["pkg"])


def test_a_circle_through_a_function_or_type_checking_import_is_found(tmp_path: Path) -> None:
    known = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import x\n",
            "pkg/b.py": "def f():\n    from pkg import c\n",
            "pkg/c.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from pkg.a import y\n",
            "pkg/d.py": "from . import a\nfrom .sub import e\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/e.py": "from .. import d\n",
            "pkg/alone.py": "import os\nimport pkg.a\n",
        },
    )
    assert circles(import_graph(known)) == [
        ["pkg.a", "pkg.b", "pkg.c"],
        ["pkg.d", "pkg.sub.e"],
    ]


def test_a_tree_without_a_circle_has_none(tmp_path: Path) -> None:
    known = _tree(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "import json\n"},
    )
    graph = import_graph(known)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == set()
    assert circles(graph) == []
