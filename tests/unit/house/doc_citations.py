"""Code names cited in the docs, looked up in the code without importing it (for
tests/unit/house/test_docs.py).

Three forms are citations: a backticked path of the repository (`ipamd/pool/manager.py`,
`ipamd/pool/`, `tests/....py::test_name`), a backticked dotted name that starts with a package
(`ipamd.pool.manager.PoolManager.run_once`), and a backticked name followed by its module in
parentheses (`` `PoolManager.run_once` (`ipamd/pool/manager.py`) ``). A name is looked up in the
module's syntax tree: its functions, classes, assignments and imports (followed to the module they
come from), and in a class its methods, class attributes, what its methods assign on `self`, and
its bases.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FENCED = re.compile(r"^```.*?^```$", re.MULTILINE | re.DOTALL)

PACKAGES = ("ipamd", "cloud", "datastore", "bench", "chaos", "tests")
IDENTIFIER = r"[A-Za-z_]\w*"
CITED_PATH = re.compile(rf"`((?:{'|'.join(PACKAGES)}|deploy|docs)/[\w./-]*?)(?:::({IDENTIFIER}))?`")
CITED_DOTTED = re.compile(rf"`((?:{'|'.join(PACKAGES)})(?:\.{IDENTIFIER})+)(?:\(\))?`")
CITED_IN_MODULE = re.compile(
    rf"`({IDENTIFIER}(?:\.{IDENTIFIER})*)(?:\(\))?` \(`((?:{'|'.join(PACKAGES)})/[\w/]+\.py)`\)"
)
FILE_SUFFIXES = {"db", "json", "sock", "md", "conflist", "txt", "yaml", "py", "conf", "proto"}
"""A dotted name ending in one of these is a file's name (`ipamd.db`), not a module's."""


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def module_file(dotted: str) -> Path | None:
    """The file of a module or package of the repository, by its dotted name."""
    base = REPO.joinpath(*dotted.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _source_of(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an `from ... import` of `path` names."""
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(node: ast.AST) -> list[ast.expr]:
    """What an assignment assigns to (nothing for any other node)."""
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, ast.AnnAssign) else []


def _class_names(cls: ast.ClassDef) -> dict[str, ast.AST]:
    """A class's methods, nested classes, class attributes and what its methods set on `self`."""
    found: dict[str, ast.AST] = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        found.update({t.id: node for t in _targets(node) if isinstance(t, ast.Name)})
    for inner in ast.walk(cls):
        for t in _targets(inner):
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            ):
                found.setdefault(t.attr, inner)
    return found


def resolve(path: Path, names: list[str], depth: int = 0) -> bool:
    """Whether `names` (`["PoolManager", "run_once"]`) is defined in the module at `path`, following
    an imported name to the module it comes from."""
    if not names:
        return True
    first, rest = names[0], names[1:]
    for node in tree(path).body:
        if isinstance(node, ast.ClassDef) and node.name == first:
            return _resolve_in_class(path, node, rest, depth)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == first:
            return not rest
        if any(isinstance(t, ast.Name) and t.id == first for t in _targets(node)):
            return not rest
        if isinstance(node, ast.ImportFrom) and depth < 5:
            for alias in node.names:
                if (alias.asname or alias.name) == first:
                    source = _source_of(path, node)
                    sub = module_file(f"{source}.{alias.name}")
                    if sub is not None:
                        return resolve(sub, rest, depth + 1)
                    found = module_file(source)
                    return found is not None and resolve(found, [alias.name, *rest], depth + 1)
    sub = module_file(f"{module_name(path)}.{first}") if path.name == "__init__.py" else None
    return sub is not None and resolve(sub, rest, depth + 1)


def _resolve_in_class(path: Path, cls: ast.ClassDef, names: list[str], depth: int) -> bool:
    """Whether `names` is defined in `cls` of the module at `path`, or in one of its bases."""
    if not names:
        return True
    node = _class_names(cls).get(names[0])
    if isinstance(node, ast.ClassDef):
        return _resolve_in_class(path, node, names[1:], depth)
    if node is not None:
        return len(names) == 1
    bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
    return depth < 5 and any(resolve(path, [base, *names], depth + 1) for base in bases)


def cited_path_exists(path: str, name: str | None) -> bool:
    target = REPO / path.rstrip("/")
    if name is not None:
        return target.suffix == ".py" and target.is_file() and resolve(target, [name])
    return target.exists() and (target.is_dir() or not path.endswith("/"))


def cited_dotted_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        found = module_file(".".join(parts[:cut]))
        if found is not None:
            return resolve(found, parts[cut:])
    return False


def broken_citations(doc: str) -> list[str]:
    """The code names `doc` cites, in the three forms above, that do not exist."""
    body = FENCED.sub("", doc)
    broken = [
        m.group(0)
        for m in CITED_PATH.finditer(body)
        if not cited_path_exists(m.group(1), m.group(2))
    ]
    broken += [
        m.group(0)
        for m in CITED_DOTTED.finditer(body)
        if m.group(1).rsplit(".", 1)[1] not in FILE_SUFFIXES and not cited_dotted_exists(m.group(1))
    ]
    broken += [
        m.group(0)
        for m in CITED_IN_MODULE.finditer(body)
        if not ((REPO / m.group(2)).is_file() and resolve(REPO / m.group(2), m.group(1).split(".")))
    ]
    return broken
