"""Builds the private runtime that `ipamd-cni` runs on when the node executes it.

The container runtime on the node executes CNI plugins itself, outside any container. `ipamd-cni` is
Python (`ipamd.cni.plugin`, stdlib only), and the node may have no Python, another version, or a C
library older than the one the image's Python was built against. So the plugin gets a runtime of its
own, built here from the interpreter running this script (the image's):

    DEST/
      ID                            content hash of everything below: the runtime's name on the node
      bin/python3                   the interpreter
      lib/ld.so                     the image's dynamic loader, under a name the launcher knows
      lib/*.so*                     every shared library the interpreter and its modules link
      lib/pythonX.Y/...             the stdlib modules the plugin can import (static closure)
      lib/pythonX.Y/ipamd/...       the plugin's own modules, beside the stdlib

The launcher (`cni-launcher.c`, the file installed as `ipamd-cni`) starts `bin/python3` through
`lib/ld.so --library-path lib`, so no library of the node is loaded. Python finds its stdlib from
`bin/python3`'s location (`lib/pythonX.Y/os.py` is its landmark), `-I` keeps the node's PYTHON*
variables, user site and working directory out, and `-B` keeps it from writing bytecode next to the
modules, which are compiled here.

`ipamd` goes in the stdlib directory itself, not in a site directory: every CPython puts that
directory on `sys.path`, whatever its `site` module does. Which site directories `site` adds depends
on who built the interpreter: upstream's (the official python image) adds `lib/pythonX.Y/
site-packages`, Debian's adds only `dist-packages` ones, so a runtime built from Debian's python3 with
`ipamd` in `site-packages` could not import the plugin.

The module set is `modulefinder`'s closure of the plugin: every `import` statement, in any branch or
function, of every module reached. Only interactive and test tooling is cut (`EXCLUDED`); anything
else the closure reaches outside the stdlib and `ipamd` fails the build, since the plugin must stay
stdlib only. `encodings` is copied whole: codecs are imported by name at run time.

What the plugin imports when it starts is a much smaller set than what is bundled (the closure holds
error paths and `TYPE_CHECKING` imports too), and it is what every pod's ADD and DEL pays for: the
build checks it against `START_IMPORTS_BUDGET` and `HEAVY_MODULES` on the built runtime, started as
the launcher starts it, and fails when the plugin has regrown. `--imports` reports the same set for
the interpreter running this script, without building.

Usage: python build_cni_bundle.py DEST   (DEST must not exist)
       python build_cni_bundle.py --imports
"""

from __future__ import annotations

import compileall
import hashlib
import importlib.util
import modulefinder
import os
import py_compile
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ENTRY = (
    "import os, sys\nfrom ipamd.cni.plugin import main\ncode = main()\n"
    "sys.stdout.flush()\nsys.stderr.flush()\nos._exit(code)\n"
)
"""What the launcher runs with `-c`: the console script `ipamd-cni`, without its wrapper, ending
with `os._exit` once its answer is flushed: the interpreter's teardown (a few milliseconds, every
ADD and DEL) frees nothing the process's end does not."""
ALLOWED_TOP_LEVEL = frozenset({"ipamd"})
"""Modules outside the stdlib that may be bundled: the plugin's own package."""
SITE_DIRS = frozenset({"site-packages", "dist-packages"})
"""Names of the directories where an interpreter's installed packages live (upstream's, Debian's):
nothing under them is stdlib, even below the stdlib directory."""
EXCLUDED = (
    "tkinter",
    "_tkinter",
    "turtle",
    "turtledemo",
    "idlelib",
    "test",
    "unittest",
    "doctest",
    "pdb",
    "pydoc",
    "pydoc_data",
    "lib2to3",
    "ensurepip",
    "distutils",
    "curses",
    "readline",
    "rlcompleter",
    "sqlite3",
    "_testcapi",
    "_testinternalcapi",
)
"""Interactive and test tooling that the closure reaches only through `help()`, debuggers and the
like; never imported by the plugin."""
START_IMPORTS_BUDGET = 21
"""How many modules importing the plugin may add to an interpreter's own start (without `site`, as
the launcher runs it: `-S`, which saves every ADD and DEL the few milliseconds `site` takes). 20
today: `ipamd`, `ipamd.cni` and its five modules (`ipam`, the commands, and `logfile`, the plugin's
log, among them), `ipamd.wire`, `ipamd.wire.codec` and `ipamd.wire.fast` (the private CPython
modules), `__future__`, the C modules `_json` and `_socket`, and `os` with what it brings
(`os.path`, `posixpath`, `genericpath`, `stat`, `_stat`, `_collections_abc`), which `site` used to
load and which are frozen into the interpreter. Each pure-Python module costs
a few tenths of a millisecond of every ADD and DEL; a regrowth usually brings a heavy one in
(below)."""
HEAVY_MODULES = (
    # What the plugin once imported and replaced: http.client (email, ssl), socket (enum,
    # selectors), json (re), dataclasses (inspect), urllib.parse, typing, collections.abc.
    "http",
    "email",
    "ssl",
    "socket",
    "selectors",
    "json",
    "re",
    "enum",
    "dataclasses",
    "inspect",
    "urllib",
    "typing",
    "typing_extensions",
    "collections",
    "functools",
    # The daemon's stack, which the plugin must never reach.
    "asyncio",
    "aiohttp",
    "sqlite3",
    "logging",
    "ipamd.engine",
    "ipamd.api",
    "ipamd.config.settings",
)
"""Modules (and their submodules) that the plugin's start must not import at all."""
_START_PROBE = (
    "import sys\n"
    "before = set(sys.modules)\n"
    "from ipamd.cni.plugin import main\n"
    "print(' '.join(sorted(set(sys.modules) - before)))\n"
)
_LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(\S+)\s+\(0x[0-9a-f]+\)\s*$")


class BundleError(Exception):
    """The runtime cannot be built as asked."""


def shared_libraries(binary: Path) -> tuple[Path | None, dict[str, Path]]:
    """`binary`'s dynamic loader and the shared libraries it links, by soname, as `ldd` resolves
    them on this system."""
    answer = subprocess.run(
        ["ldd", str(binary)], capture_output=True, text=True, check=False, env={"LC_ALL": "C"}
    )
    if "not a dynamic executable" in answer.stdout + answer.stderr:
        return None, {}
    if answer.returncode != 0:
        raise BundleError(f"ldd {binary}: {answer.stderr.strip()}")
    loader: Path | None = None
    libraries: dict[str, Path] = {}
    for line in answer.stdout.splitlines():
        if "not found" in line:
            raise BundleError(f"{binary}: a library is missing: {line.strip()}")
        match = _LDD_LINE.match(line)
        if match is None:
            continue
        soname, path = match.groups()
        if soname is None:
            if path.startswith("/"):
                loader = Path(path)  # the interpreter line: /lib64/ld-linux-x86-64.so.2 (0x...)
            continue  # linux-vdso.so.1 has no file
        libraries[soname] = Path(path)
    return loader, libraries


def _package_dirs(top: str) -> list[str]:
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise BundleError(f"package {top} is not installed")
    return list(spec.submodule_search_locations)


def module_closure() -> dict[str, Path]:
    """Every module file the plugin can import, by dotted name (builtins have no file)."""
    search = list(sys.path)
    for top in sorted(ALLOWED_TOP_LEVEL):
        # An editable install puts the package on the path through an import hook, which
        # modulefinder does not run: give it the package's parent directory.
        search.extend(str(Path(d).parent) for d in _package_dirs(top))
    finder = modulefinder.ModuleFinder(path=search, excludes=list(EXCLUDED))
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "entry.py"
        script.write_text("import site\nimport encodings\n" + ENTRY)
        finder.run_script(str(script))
    # `from ipamd.wire import X` makes modulefinder look for a submodule X too: names it could not
    # find as modules but a package it found may define are "maybe missing", not missing.
    not_found, _maybe_names = finder.any_missing_maybe()
    missing = sorted(n for n in not_found if n.split(".")[0] in ALLOWED_TOP_LEVEL)
    if missing:
        raise BundleError(f"the plugin's modules were not found: {', '.join(missing)}")
    files: dict[str, Path] = {}
    for name, module in finder.modules.items():
        path = getattr(module, "__file__", None)  # modulefinder's Module: None for builtins
        if path and name != "__main__":
            files[name] = Path(path)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for codec in sorted((stdlib / "encodings").glob("*.py")):
        files.setdefault(f"encodings.{codec.stem}", codec)
    return files


def destination(name: str, source: Path, lib_dir: Path) -> Path:
    """Where module `name` (file `source`) goes in the runtime's `lib/pythonX.Y`."""
    for key in ("stdlib", "platstdlib"):
        root = Path(sysconfig.get_paths()[key])
        if source.is_relative_to(root) and not SITE_DIRS & set(source.relative_to(root).parts):
            return lib_dir / source.relative_to(root)
    top = name.split(".", maxsplit=1)[0]
    if top not in ALLOWED_TOP_LEVEL:
        raise BundleError(f"the plugin reaches {name} ({source}): only the stdlib may be bundled")
    depth = name.count(".") + (1 if source.name == "__init__.py" else 0)
    package_root = source.parents[depth]
    return lib_dir / source.relative_to(package_root)


def copy_libraries(binaries: list[Path], lib: Path) -> Path:
    """Copies every library the binaries link into `lib`; returns the loader's copy, `lib/ld.so`."""
    loaders: set[Path] = set()
    for binary in binaries:
        loader, libraries = shared_libraries(binary)
        if loader is not None:
            loaders.add(loader.resolve())
        for soname, path in libraries.items():
            if not (lib / soname).exists():
                shutil.copy2(path.resolve(), lib / soname)
    if len(loaders) != 1:
        raise BundleError(f"expected one dynamic loader, found {sorted(map(str, loaders))}")
    shutil.copy2(loaders.pop(), lib / "ld.so")
    return lib / "ld.so"


def content_id(root: Path) -> str:
    """A hash of every path and byte under `root`: equal runtimes get equal names on the node."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build(dest: Path) -> str:
    """Builds the runtime in `dest`; returns its ID."""
    if dest.exists():
        raise BundleError(f"{dest} exists")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    lib = dest / "lib"
    lib_dir = lib / version
    (dest / "bin").mkdir(parents=True)
    lib_dir.mkdir(parents=True)
    interpreter = Path(os.path.realpath(sys.executable))
    shutil.copy2(interpreter, dest / "bin" / "python3")
    extensions: list[Path] = []
    for name, source in sorted(module_closure().items()):
        target = destination(name, source, lib_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        if target.suffix == ".so":
            extensions.append(target)
    copy_libraries([interpreter, *extensions], lib)
    # Compiled once here, checked never: the node's copy is never edited, and a plugin run must not
    # pay for compiling or try to write next to its sources.
    compileall.compile_dir(
        lib_dir,
        quiet=2,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    runtime_id = content_id(dest)
    (dest / "ID").write_text(runtime_id + "\n")
    return runtime_id


def runtime_command(dest: Path) -> list[str]:
    """How the launcher starts the runtime's interpreter (`cni-launcher.c`), up to `-c`."""
    lib = dest / "lib"
    return [
        str(lib / "ld.so"),
        "--library-path",
        str(lib),
        str(dest / "bin" / "python3"),
        "-I",
        "-S",
        "-B",
    ]


def start_imports(interpreter: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The modules that importing the plugin adds to what `interpreter` (a command up to `-c`)
    loads by itself, sorted."""
    answer = subprocess.run(
        [*interpreter, "-c", _START_PROBE],
        capture_output=True,
        text=True,
        check=False,
        env=env if env is not None else {},
        timeout=60,
    )
    if answer.returncode != 0:
        raise BundleError(f"the runtime cannot import the plugin: {answer.stderr.strip()}")
    return answer.stdout.split()


def heavy_imports(modules: list[str]) -> list[str]:
    """The members of `modules` that `HEAVY_MODULES` names, or that are submodules of one."""
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES)]


def local_imports() -> list[str]:
    """`start_imports` on this interpreter, on the `ipamd` this script would bundle: isolated and
    without `site`, as the launcher runs the plugin on the node."""
    parents = [str(Path(d).parent) for d in _package_dirs("ipamd")]
    setup = f"import sys\nsys.path[:0] = {parents!r}\n"
    probe = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", setup + _START_PROBE],
        capture_output=True,
        text=True,
        check=False,
        env={},
        timeout=60,
    )
    if probe.returncode != 0:
        raise BundleError(f"cannot import the plugin: {probe.stderr.strip()}")
    return probe.stdout.split()


def check_start(modules: list[str]) -> None:
    """Fails when the plugin's start imports a heavy module or more than the budget."""
    heavy = heavy_imports(modules)
    if heavy:
        raise BundleError(f"the plugin's start imports {', '.join(heavy)}: see HEAVY_MODULES")
    if len(modules) > START_IMPORTS_BUDGET:
        raise BundleError(
            f"the plugin's start imports {len(modules)} modules, over the budget of "
            f"{START_IMPORTS_BUDGET}: {' '.join(modules)}"
        )


def check(dest: Path) -> list[str]:
    """Imports the plugin on the runtime alone, as the launcher starts it, with an empty
    environment: a module or library missing from the bundle fails the build, not a pod's ADD; so
    does a start that regrew (`check_start`). Returns the modules the plugin's start imports."""
    command = runtime_command(dest)
    # `json` is imported only to word the error of a body that is not JSON: it must be there.
    lazy = subprocess.run(
        [*command, "-c", "import ipamd.cni.plugin, json"],
        capture_output=True,
        text=True,
        check=False,
        env={},
        timeout=60,
    )
    if lazy.returncode != 0:
        raise BundleError(f"the runtime cannot import the plugin: {lazy.stderr.strip()}")
    modules = start_imports(command)
    check_start(modules)
    return modules


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: build_cni_bundle.py DEST | --imports", file=sys.stderr)
        return 2
    try:
        if argv[1] == "--imports":
            modules = local_imports()
            print("\n".join(modules))
            print(
                f"build_cni_bundle: the plugin's start imports {len(modules)} modules",
                file=sys.stderr,
            )
            return 0
        dest = Path(argv[1])
        runtime_id = build(dest)
        modules = check(dest)
    except BundleError as err:
        print(f"build_cni_bundle: {err}", file=sys.stderr)
        return 1
    bundled = sum(1 for _ in (dest / "lib").rglob("*.py"))
    print(
        f"build_cni_bundle: {dest} ({runtime_id}): {bundled} modules bundled; the plugin's start "
        f"imports {len(modules)} (budget {START_IMPORTS_BUDGET}): {' '.join(modules)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
