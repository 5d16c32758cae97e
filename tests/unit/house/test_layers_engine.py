"""Nothing outside `ipamd/engine/` writes on the engine: other parts reach it through its methods
(`subscribe`, `block_eni`, `close_subnets`, `take_demand`, ...), never by assigning to its attributes
or mutating what they hold. The check reads every module of ipamd/, bench/, chaos/ and tests/ with
`ast`: an expression whose last name is `engine` or `_engine` (`engine`, `self._engine`,
`daemon.engine`, `node.engine`, ...) is taken to be an engine."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHECKED = ("ipamd", "bench", "chaos", "tests")
EXEMPT = ROOT / "ipamd" / "engine"
ENGINE_NAMES = frozenset({"engine", "_engine"})
MUTATORS = frozenset(
    {"append", "pop", "clear", "set", "update", "discard", "remove", "add", "extend", "insert"}
    | {"setdefault", "popitem"}
)


def _is_engine(node: ast.expr) -> bool:
    """Whether `node` names an engine: `engine`, or any `<...>.engine` / `<...>._engine`."""
    if isinstance(node, ast.Name):
        return node.id in ENGINE_NAMES
    return isinstance(node, ast.Attribute) and node.attr in ENGINE_NAMES


def _on_engine(node: ast.expr) -> bool:
    """Whether `node` is an attribute of an engine, or something held in one (`engine.x`,
    `engine.x[k]`, `engine.x.y`)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute) and _is_engine(node.value):
            return True
        node = node.value
    return False


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _unpacked(target)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        yield node.target
    elif isinstance(node, ast.Delete):
        yield from node.targets


def _unpacked(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _unpacked(element)
    else:
        yield target


def engine_writes(source: str, filename: str = "<string>") -> list[str]:
    """Each write on an engine in `source`, as `file:line: code`."""
    found: list[ast.expr] = []
    for node in ast.walk(ast.parse(source, filename)):
        bad = [t for t in _targets(node) if _on_engine(t)]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and _on_engine(node.func.value)
        ):
            bad.append(node.func)
        found.extend(bad)
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    return [f"{filename}:{n.lineno}: {ast.unparse(n)}" for n in found]


def _modules() -> Iterator[Path]:
    for top in CHECKED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if not path.is_relative_to(EXEMPT):
                yield path


def test_no_module_outside_the_engine_writes_on_it() -> None:
    found = [
        write
        for path in _modules()
        for write in engine_writes(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "use the engine's methods instead:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_write() -> None:
    bad = """
engine.unavailable = None
self._engine.closed_subnets = frozenset()
daemon.engine.listeners.append(f)
node.engine.blocked_enis["eni-1"] = "why"
del parts.engine.blocked_enis["eni-1"]
api.engine.blocked_enis.pop("eni-1", None)
engine.pool_wanted.set()
engine.counter += 1
a, engine.state = 1, 2
engine.blocked_enis.clear()
"""
    found = engine_writes(bad)
    assert [line.split(":")[1] for line in found] == [str(n) for n in range(2, 12)], found


def test_the_check_lets_reads_and_the_engines_methods_through() -> None:
    fine = """
engine.subscribe(f)
self._engine.block_eni("eni-1", "why")
daemon.engine.close_subnets({"subnet-1"})
closed = node.engine.closed_subnets
held = set(engine.held_back())
engine = open_engine()
self._engine = engine
items = engine.state.allocations().values()
copy = dict(engine.blocked_enis)
copy.pop("eni-1", None)
"""
    assert engine_writes(fine) == []
