"""The design documents keep up with the code.

- Every scenario the code names (a `test_sNN_...` test, or `S<n>` in a comment or docstring) has its
  entry in docs/failure-scenarios.md, with at least one test; every `test_sNN_...` test is listed in
  the entry of scenario NN; every test the catalogue names exists; a module that names scenarios
  points at the catalogue; every incident the code names (`seed 001`) is in the catalogue.
- Every section the code cites as `docs/<file>.md §N.M` exists as a numbered heading of that file,
  and a section sign that is not part of such a citation is refused (it points nowhere). Sections
  and anchors the docs cite in each other exist too.
- The README's "What is here" table names every package and module of `ipamd/`, and every other
  top-level part of the repository.
- docs/architecture.md §1.3 states each layers contract of `pyproject.toml` as it is there.
- Every code name that the docs (docs/*.md) and the README cite exists: a path, a dotted name from a
  package, or a name with its module in parentheses, looked up in the module's syntax tree
  (tests/unit/house/doc_citations.py says how).

It only reads files: nothing of the code under test is imported.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from tests.unit.house.doc_citations import CITED_PATH, broken_citations

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs"
CATALOGUE = DOCS / "failure-scenarios.md"
THIS = Path(__file__).resolve()

CODE_DIRS = ("ipamd", "cloud", "datastore", "bench", "chaos", "tests", "deploy")
CODE_SUFFIXES = {".py", ".sh", ".c", ".yaml", ".json", ".conflist", ".txt", ".proto"}
SKIPPED = {"_generated", "__pycache__"}

SECTION_SIGN = "\N{SECTION SIGN}"
NUMBER = r"\d+(?:\.\d+)*"
CITATION = re.compile(rf"docs/([\w-]+\.md) {SECTION_SIGN}({NUMBER})")
DOC_CITATION = re.compile(rf"(?:\b([\w-]+\.md) )?{SECTION_SIGN}({NUMBER})")
HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$", re.MULTILINE)
NUMBERED = re.compile(rf"^({NUMBER})\.? ")
FENCED = re.compile(r"^```.*?^```$", re.MULTILINE | re.DOTALL)
ANCHOR_LINK = re.compile(r"\]\(([\w-]+\.md)?#([\w-]+)\)")

SCENARIO_TEST = re.compile(r"^\s*(?:async\s+)?def (test_s(\d{2})_\w*)\(", re.MULTILINE)
SCENARIO_MENTION = re.compile(r"\bS([1-9]\d?)\b")
SCENARIO_ENTRY = re.compile(r"^S(\d+)\. ")
INCIDENT_MENTION = re.compile(r"\bseed (\d{3})\b", re.IGNORECASE)
INCIDENT_ENTRY = re.compile(r"^Seed (\d{3}): ")
TEST_REFERENCE = re.compile(r"`(tests/[\w./-]+\.py)::(\w+)`")


# -- reading ---------------------------------------------------------------------------------------


def code_files() -> Iterator[Path]:
    """Every source file of the code directories (not this one, not generated code), plus the
    Makefile and the Dockerfile, in a fixed order."""
    for name in ("Makefile", "Dockerfile"):
        if (REPO / name).is_file():
            yield REPO / name
    for top in CODE_DIRS:
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix not in CODE_SUFFIXES or not path.is_file() or path == THIS:
                continue
            if SKIPPED.isdisjoint(path.relative_to(REPO).parts):
                yield path


@cache
def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def sections(doc: Path) -> dict[str, str]:
    """Heading title → the text under it, up to the next heading of the same or a higher level.
    Lines in fenced code blocks are not headings."""
    body = FENCED.sub("", text(doc))
    heads = list(HEADING.finditer(body))
    found: dict[str, str] = {}
    for i, head in enumerate(heads):
        level = len(head.group(1))
        end = next(
            (h.start() for h in heads[i + 1 :] if len(h.group(1)) <= level),
            len(body),
        )
        found[head.group(2)] = body[head.end() : end]
    return found


def section_numbers(doc: Path) -> set[str]:
    """The numbers of the numbered headings (`### 3.2 The state ...` → `3.2`)."""
    return {m.group(1) for title in sections(doc) if (m := NUMBERED.match(title))}


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in sections(doc)}


def entries(pattern: re.Pattern[str]) -> dict[str, str]:
    """The catalogue's entries whose heading matches `pattern`: its number → the entry's text."""
    return {
        m.group(1).lstrip("0") or "0": body
        for title, body in sections(CATALOGUE).items()
        if (m := pattern.match(title))
    }


def scenario_entries() -> dict[int, str]:
    return {int(n): body for n, body in entries(SCENARIO_ENTRY).items()}


def scenario_tests() -> list[tuple[str, str, int]]:
    """(file, test name, scenario number) of every `test_sNN_...` test."""
    return [
        (relative(path), m.group(1), int(m.group(2)))
        for path in code_files()
        if relative(path).startswith("tests/") and path.suffix == ".py"
        for m in SCENARIO_TEST.finditer(text(path))
    ]


def scenario_mentions() -> dict[int, list[str]]:
    """Scenario number → the files that mention it as `S<n>`."""
    found: dict[int, list[str]] = {}
    for path in code_files():
        for n in sorted({int(m.group(1)) for m in SCENARIO_MENTION.finditer(text(path))}):
            found.setdefault(n, []).append(relative(path))
    return found


def references(entry: str) -> list[tuple[str, str]]:
    return TEST_REFERENCE.findall(entry)


def defines(path: str, name: str) -> bool:
    file = REPO / path
    return (
        file.is_file()
        and re.search(rf"^\s*(?:async\s+)?def {name}\(", text(file), re.M) is not None
    )


# -- the scenario catalogue ----------------------------------------------------------------------


def test_the_catalogue_is_found_and_parsed() -> None:
    catalogue = scenario_entries()
    assert len(catalogue) >= 30, sorted(catalogue)
    assert all(references(entry) for entry in catalogue.values())
    assert len(scenario_tests()) >= 50, "the scenario tests are found"


def test_every_scenario_the_code_names_has_an_entry_with_its_tests() -> None:
    catalogue, mentions = scenario_entries(), scenario_mentions()
    named = {n for _, _, n in scenario_tests()} | set(mentions)
    missing = {n: mentions.get(n, ["a test_sNN_ name"]) for n in named - set(catalogue)}
    assert missing == {}, f"scenarios named in the code but not in {relative(CATALOGUE)}"
    without_tests = sorted(n for n in named if not references(catalogue[n]))
    assert without_tests == [], "entries that name no test"


def test_every_named_scenario_test_is_listed_under_its_scenario() -> None:
    catalogue = scenario_entries()
    unlisted = [
        f"S{n}: {path}::{name}"
        for path, name, n in scenario_tests()
        if n in catalogue and (path, name) not in references(catalogue[n])
    ]
    assert unlisted == [], f"tests missing from their entry in {relative(CATALOGUE)}"


def test_every_test_the_catalogue_names_exists() -> None:
    named = TEST_REFERENCE.findall(text(CATALOGUE))
    assert named
    gone = [f"{path}::{name}" for path, name in named if not defines(path, name)]
    assert gone == [], f"{relative(CATALOGUE)} names tests that do not exist"


def test_a_module_that_names_scenarios_points_at_the_catalogue() -> None:
    files = sorted({f for paths in scenario_mentions().values() for f in paths})
    assert files
    silent = [f for f in files if "docs/failure-scenarios.md" not in text(REPO / f)]
    assert silent == [], "name S<n> without saying where the catalogue is"


def test_every_incident_the_code_names_is_in_the_catalogue() -> None:
    incidents = entries(INCIDENT_ENTRY)
    assert {"0", "1", "2", "3"} <= set(incidents), sorted(incidents)
    unknown = sorted(
        f"{relative(path)}: seed {m.group(1)}"
        for path in code_files()
        for m in INCIDENT_MENTION.finditer(text(path))
        if (m.group(1).lstrip("0") or "0") not in incidents
    )
    assert unknown == []


# -- section citations ---------------------------------------------------------------------------


def test_every_section_the_code_cites_exists() -> None:
    cited = [
        (relative(p), m.group(1), m.group(2))
        for p in code_files()
        for m in CITATION.finditer(text(p))
    ]
    assert cited, "the code cites the design"
    broken = [
        f"{path}: docs/{doc} {SECTION_SIGN}{number}"
        for path, doc, number in cited
        if not (DOCS / doc).is_file() or number not in section_numbers(DOCS / doc)
    ]
    assert broken == [], "citations of sections that do not exist"


def test_a_section_sign_in_the_code_is_always_a_citation_of_a_doc() -> None:
    stray = [
        f"{relative(path)}:{number}: {line.strip()}"
        for path in code_files()
        for number, line in enumerate(text(path).splitlines(), 1)
        if line.count(SECTION_SIGN) != len(CITATION.findall(line))
    ]
    assert stray == [], "cite sections as `docs/<file>.md \N{SECTION SIGN}N.M`"


def test_sections_and_anchors_the_docs_cite_exist() -> None:
    broken: list[str] = []
    for doc in sorted(DOCS.glob("*.md")):
        for m in DOC_CITATION.finditer(text(doc)):
            target = DOCS / (m.group(1) or doc.name)
            if not target.is_file() or m.group(2) not in section_numbers(target):
                broken.append(f"{doc.name}: {m.group(0)}")
        for m in ANCHOR_LINK.finditer(text(doc)):
            target = DOCS / (m.group(1) or doc.name)
            if not target.is_file() or m.group(2) not in anchors(target):
                broken.append(f"{doc.name}: {m.group(0)}")
    assert broken == []


# -- the README's table --------------------------------------------------------------------------


def readme_parts() -> set[str]:
    """The backticked names in the rows of the README's "What is here" table."""
    readme = text(REPO / "README.md")
    section = readme.split("\n## What is here\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row)}


def expected_parts() -> set[str]:
    """Each package and module of `ipamd/`, every other top-level package and its subpackages,
    and `deploy/`, `docs/`."""
    parts = {"deploy/", "docs/"}
    for entry in sorted((REPO / "ipamd").iterdir()):
        if entry.is_dir() and (entry / "__init__.py").is_file():
            parts.add(f"ipamd/{entry.name}/")
        elif entry.suffix == ".py" and entry.name != "__init__.py":
            parts.add(f"ipamd/{entry.name}")
    for top in sorted(REPO.iterdir()):
        if top.name in {"ipamd", "tests"} or not (top / "__init__.py").is_file():
            continue
        parts.add(f"{top.name}/")
        parts.update(f"{top.name}/{sub.parent.name}/" for sub in sorted(top.glob("*/__init__.py")))
    parts.add("tests/")
    return parts


def test_the_readme_names_every_part() -> None:
    named = readme_parts()
    assert "ipamd/engine/" in named, "the table is found"
    unnamed = sorted(expected_parts() - named)
    assert unnamed == [], "parts missing from the README's 'What is here' table"


# -- code names cited in the docs ------------------------------------------------------------------

CITING_DOCS = (*sorted(DOCS.glob("*.md")), REPO / "README.md")


def test_the_citation_checker_finds_what_is_broken() -> None:
    sample = """
The pool (`ipamd/pool/manager.py`, `ipamd/pool/`) runs `ipamd.pool.manager.PoolManager.run_once`,
and `PoolManager.run` (`ipamd/pool/manager.py`) ticks; `ipamd.sizing.plan_pool` is re-exported.
`Engine.snapshot` (`ipamd/engine/engine.py`), `ipamd.db` and `ipamd run --embedded` are fine,
and so is `Engine.close_subnets` (`ipamd/engine/engine.py`), a method of a base class of Engine.
Broken: `ipamd/pool/nowhere.py`, `ipamd.pool.manager.PoolManager.no_such_method`,
`ipamd.no_such_module.Thing`, `PoolManager.run` (`ipamd/engine/engine.py`),
`tests/unit/house/test_docs.py::test_that_does_not_exist`.
"""
    assert broken_citations(sample) == [
        "`ipamd/pool/nowhere.py`",
        "`tests/unit/house/test_docs.py::test_that_does_not_exist`",
        "`ipamd.pool.manager.PoolManager.no_such_method`",
        "`ipamd.no_such_module.Thing`",
        "`PoolManager.run` (`ipamd/engine/engine.py`)",
    ]


def test_every_code_name_the_docs_cite_exists() -> None:
    cited = {doc: text(doc) for doc in CITING_DOCS}
    assert all(CITED_PATH.search(body) for body in cited.values()), "the docs cite code"
    broken = [
        f"{relative(doc)}: {c}" for doc, body in cited.items() for c in broken_citations(body)
    ]
    assert broken == [], "cited code names that do not exist"


# -- the layers the design states -----------------------------------------------------------------


def stated_layers(layers: list[str]) -> str:
    """A layers contract as docs/architecture.md §1.3 states it: `main | cli` > `node` > ..."""
    return " > ".join(f"`{' | '.join(layer.split(' | '))}`" for layer in layers)


def test_the_design_states_every_layers_contract_as_it_is() -> None:
    contracts = tomllib.loads(text(REPO / "pyproject.toml"))["tool"]["importlinter"]["contracts"]
    layered = [c for c in contracts if c["type"] == "layers"]
    assert {c["containers"][0] for c in layered} >= {"ipamd", "ipamd.node", "ipamd.config"}
    section = " ".join(
        sections(DOCS / "architecture.md")["1.3 Layers and who may import whom"].split()
    )
    missing = [
        f"{c['containers'][0]}: {stated_layers(c['layers'])}"
        for c in layered
        if stated_layers(c["layers"]) not in section
    ]
    assert missing == [], "docs/architecture.md \N{SECTION SIGN}1.3 differs from pyproject.toml"
