"""The plugin's fast paths (`ipamd.wire.fast`): on this interpreter every private module is there,
so none fell back; where one is missing (its name made to point nowhere) the public fallback keeps
the plugin correct and `fell_back` names it; and each is loaded only by the code that asks for it.
Each runs in a fresh interpreter: what is measured is an import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PRIVATE = ("_sha1", "_json", "_socket", "_struct")

GONE = """
import sys

class Absent:  # `_json` and `_sha1` as if this CPython had none: their wrappers do without them
    def find_spec(self, name, path=None, target=None):
        if name in ("_json", "_sha1"):
            raise ImportError(name)

sys.meta_path.insert(0, Absent())
from ipamd.wire import fast

# `socket` and `struct` wrap `_socket` and `_struct`: those are made to be found under no name.
moved = {n: ("_gone" + p, w) for n, (p, w) in fast.FAST_PATHS.items() if p in ("_socket", "_struct")}
fast.FAST_PATHS.update(moved)
"""

USE_ALL = """
import json as public_json, hashlib
from ipamd.wire import fast
from ipamd.wire.fast import pack, sha1, socket_core, unpack_from
from ipamd.wire.codec import dumps, parse_object
body = {"a": [1, 2.5, "é"], "b": None}
print(public_json.dumps({
    "fell_back": fast.fell_back,
    "sha1": sha1(b"default.web-0").hexdigest() == hashlib.sha1(b"default.web-0").hexdigest(),
    "json": parse_object(dumps(body).encode()) == body
    and dumps(body) == public_json.dumps(body, separators=(",", ":")),
    "struct": unpack_from("=HI", pack("=HI", 7, 9)) == (7, 9),
    "socket": socket_core.AF_UNIX == 1,
}))
"""


def _run(code: str) -> object:
    """What `code`, run in a fresh interpreter without `site`, printed last (as JSON)."""
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_on_this_interpreter_no_fast_path_falls_back() -> None:
    assert _run(USE_ALL) == {
        "fell_back": [],
        "sha1": True,
        "json": True,
        "struct": True,
        "socket": True,
    }, "a private module moved in this CPython: the plugin is correct but slower"


def test_without_the_private_modules_the_fallbacks_answer_alike() -> None:
    got = _run(GONE + USE_ALL)
    assert isinstance(got, dict)
    fell_back = got.pop("fell_back")
    assert isinstance(fell_back, list)
    assert sorted(fell_back) == ["_gone_socket", "_gone_struct", "_json", "_sha1"]
    assert got == {"sha1": True, "json": True, "struct": True, "socket": True}


def test_the_ipam_plugins_start_loads_only_the_fast_paths_it_uses() -> None:
    code = (
        "import sys, json\nimport ipamd.cni.plugin\n"
        f"print(json.dumps(sorted(m for m in {PRIVATE!r} if m in sys.modules)))"
    )
    assert _run(code) == ["_json", "_socket"]
