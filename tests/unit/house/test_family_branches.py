"""Branches on the address family, counted where the family should not be decided.

A node is IPv4 or IPv6 (docs/architecture.md §1.1), and the parts that differ by family should
receive what they differ by rather than test for it. This test counts the branches whose test
mentions the family outside the places allowed to: `cloud/` (EC2's own shapes differ by family),
`ipamd/cni/` (the plugin sets up a pod's interface per family, as the reference plugins do) and a
family's own strategy modules, named for it (`*_v4.py`, `*_v6.py`: `ipamd/engine/units_v6.py`,
`ipamd/engine/pick_v6.py`), which a part receives once instead of testing for the family.
A branch is an `if`, an `elif`, a conditional expression, a `while` or a comprehension's filter
whose test names the family (`family`), IPv6 or v6 (`enable_ipv6`, `IPV6_PREFIX`, `is_v6`,
"ipv6_prefix", ...) or sniffs it from an address's text (`":" in address`). A socket's family
compared with `AF_UNIX` (whether a connection came over a unix socket) is its transport, not the
address family, and is not counted.

At most `LIMIT` such branches may stand, and the test fails above it. `CEILING` is the count as
it stands, at or under the limit, so that no new branch on the family goes in unseen even below
it: each one that goes lowers it. The counter itself is checked on samples.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ALLOWED = ("ipamd/cni/",)
STRATEGY_SUFFIXES = ("_v4.py", "_v6.py")
CEILING = 8
LIMIT = 10
MENTIONS = re.compile(r"family|ipv6|v6", re.IGNORECASE)


def _unix_socket_tests(test: ast.expr) -> set[int]:
    """The nodes under comparisons with `AF_UNIX`: a socket's family asked whether it is a unix
    socket (the API's peer credentials) is its transport, not the node's address family."""
    skipped: set[int] = set()
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Name | ast.Attribute)
            and (side.id if isinstance(side, ast.Name) else side.attr) == "AF_UNIX"
            for side in (node.left, *node.comparators)
        ):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def _mentions_family(test: ast.expr) -> bool:
    unix = _unix_socket_tests(test)
    for node in ast.walk(test):
        if id(node) in unix:
            continue
        if isinstance(node, ast.Name) and MENTIONS.search(node.id):
            return True
        if isinstance(node, ast.Attribute) and MENTIONS.search(node.attr):
            return True
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and MENTIONS.search(node.value)
        ):
            return True
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Constant)
            and node.left.value == ":"
            and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
        ):
            return True
    return False


def _tests(tree: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.If | ast.IfExp | ast.While):
            yield node.test
        elif isinstance(node, ast.comprehension):
            yield from node.ifs


def family_branches(source: str) -> list[tuple[int, str]]:
    """(line, test) of each branch on the family in `source`."""
    return [
        (test.lineno, ast.unparse(test))
        for test in _tests(ast.parse(source))
        if _mentions_family(test)
    ]


def counted() -> list[str]:
    found = []
    for path in sorted((REPO / "ipamd").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(ALLOWED) or rel.endswith(STRATEGY_SUFFIXES):
            continue
        found += [f"{rel}:{line}: {test}" for line, test in family_branches(path.read_text())]
    return found


def test_at_most_the_limit_of_branches_on_the_family() -> None:
    found = counted()
    assert len(found) <= LIMIT, "branches on the family over the limit:\n" + "\n".join(found)


def test_no_new_branch_on_the_family() -> None:
    found = counted()
    assert len(found) <= CEILING, "new branches on the family:\n" + "\n".join(found)


def test_the_ceiling_comes_down_as_branches_go() -> None:
    """A ceiling above the count would let branches come back unseen: lower it as they go."""
    assert len(counted()) == CEILING, f"{len(counted())} branches: set CEILING to it"
    assert CEILING <= LIMIT


@pytest.mark.parametrize(
    "source",
    [
        "if config.family.enable_ipv6:\n    pass",
        "x = 1 if family == 'ipv6' else 2",
        "if a:\n    pass\nelif unit.kind == IPV6_PREFIX:\n    pass",
        "y = [a for a in addresses if ':' in a]",
        "while state.is_v6(cidr):\n    pass",
        "if kind == 'ipv6_prefix':\n    pass",
        "if not self.settings.ipv6_egress_cidr:\n    pass",
        "if msg['family'] != AF_INET:\n    pass",
        "if sock.family != socket.AF_UNIX or family == 'ipv6':\n    pass",
    ],
)
def test_a_branch_on_the_family_is_counted(source: str) -> None:
    assert len(family_branches(source)) == 1


@pytest.mark.parametrize(
    "source",
    [
        "if config.enable_ipv4_only_words:\n    pass",
        "if unit.kind == 'prefix':\n    pass",
        "x = a if ':' == b else c",
        "if 'x' in address:\n    pass",
        "def ipv6_pool():\n    return 1",  # a name, not a branch
        "if sock is None or sock.family != socket.AF_UNIX:\n    pass",  # a unix socket or not
    ],
)
def test_what_is_not_a_branch_on_the_family_is_not_counted(source: str) -> None:
    assert family_branches(source) == []
