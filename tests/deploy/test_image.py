"""The image's moving parts, run here without a container engine: the plugin's private runtime built
from this interpreter, the static launcher, the init container's install script on a directory
standing in for the node's CNI bin dir, the probe script against a unix-socket server, and the
pinned dependency list. `docker build` itself needs an engine, which this machine lacks."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socketserver
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import ClassVar

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ipamd.wire import SUPPORTED_CNI_VERSIONS
from tests.deploy.repo import DOCKERFILE, IMAGE_DIR, REPO

INSTALL = IMAGE_DIR / "install-cni.sh"
PROBE = IMAGE_DIR / "ipamd_probe.py"
GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc (with a static libc) absent")


@dataclass
class Built:
    bundle: Path
    launcher: Path
    runtime_id: str


def static_launcher(dest: Path) -> Path:
    assert GCC is not None
    out = dest / "ipamd-cni"
    subprocess.run(
        [
            GCC,
            "-static",
            "-Os",
            "-s",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(out),
            str(IMAGE_DIR / "cni-launcher.c"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The runtime and launcher as the Dockerfile's build stage makes them, from this interpreter."""
    if GCC is None:
        pytest.skip("gcc (with a static libc) absent")
    root = tmp_path_factory.mktemp("image")
    bundle = root / "bundle"
    result = subprocess.run(
        [sys.executable, str(IMAGE_DIR / "build_cni_bundle.py"), str(bundle)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return Built(bundle, static_launcher(root), (bundle / "ID").read_text().strip())


@pytest.fixture
def node_bin(tmp_path: Path) -> Path:
    """A node's CNI bin dir with the reference plugins the conflist needs (stand-ins)."""
    bin_dir = tmp_path / "opt-cni-bin"
    bin_dir.mkdir()
    for plugin in ("loopback", "portmap"):
        (bin_dir / plugin).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / plugin).chmod(0o755)
    return bin_dir


def install(
    built: Built, bin_dir: Path, bundle: Path | None = None, plugins: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "IPAMD_CNI_BIN_DIR": str(bin_dir),
        "IPAMD_CNI_BUNDLE": str(bundle or built.bundle),
        "IPAMD_CNI_LAUNCHER": str(built.launcher),
        "IPAMD_CNI_PLUGINS": str(plugins or bin_dir / "no-plugins-shipped"),
    }
    return subprocess.run(
        ["/bin/sh", str(INSTALL)], env=env, capture_output=True, text=True, check=False, timeout=120
    )


def run_plugin(
    plugin: Path, command: str, conf: dict[str, object] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """The plugin as a node's runtime runs it: CNI_* variables and nothing else of ours."""
    cni_env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "deploy-test",
        "CNI_NETNS": "/var/run/netns/deploy-test",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(plugin.parent),
        **env,
    }
    stdin = json.dumps(conf) if conf is not None else ""
    return subprocess.run(
        [str(plugin)],
        input=stdin,
        env=cni_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def net_conf(socket: Path) -> dict[str, object]:
    return {
        "cniVersion": "1.0.0",
        "name": "ipamd",
        "type": "ptp",
        "ipam": {"type": "ipamd-cni", "socket": str(socket)},
    }


def test_runtime_holds_the_plugin_its_interpreter_and_loader(built: Built) -> None:
    lib = built.bundle / "lib"
    assert (lib / "ld.so").is_file() and (built.bundle / "bin" / "python3").is_file()
    assert any(lib.glob("libc.so.*")), "the image's C library travels with the runtime"
    (stdlib,) = lib.glob("python3.*")
    # Beside the stdlib, which every CPython layout has on sys.path (build_cni_bundle.py says why).
    plugin = stdlib / "ipamd" / "cni" / "plugin.py"
    assert plugin.is_file()
    assert not any(stdlib.glob("*-packages")), "no site directory: nothing relies on `site`"
    assert not list(lib.rglob("aiohttp")), "the plugin is stdlib only"
    assert re.fullmatch(r"[0-9a-f]{16}", built.runtime_id)


def test_the_runtime_starts_the_plugin_on_its_own_modules_and_two_c_modules(built: Built) -> None:
    """As the launcher starts it (without `site`), importing the plugin loads `ipamd`'s modules,
    `__future__`, the C modules under `json` and `socket`, and `os` with the modules it brings
    (frozen into the interpreter, which `site` would have loaded): neither package, nor `re`,
    `http`, `dataclasses` or `typing` (the build checks the budget too: build_cni_bundle.py)."""
    lib = built.bundle / "lib"
    probe = (
        "import sys\nbefore = set(sys.modules)\nfrom ipamd.cni.plugin import main\n"
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    python = built.bundle / "bin" / "python3"
    answer = subprocess.run(
        [
            str(lib / "ld.so"),
            "--library-path",
            str(lib),
            str(python),
            "-I",
            "-S",
            "-B",
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        env={},
        timeout=60,
        check=True,
    )
    added = answer.stdout.split()
    assert {"ipamd.cni.plugin", "ipamd.wire", "_json", "_socket"} <= set(added)
    os_itself = {"os", "posixpath", "genericpath", "stat", "_stat", "_collections_abc"}
    allowed = {"ipamd", "__future__", "_json", "_socket", *os_itself}
    others = [m for m in added if m.split(".")[0] not in allowed]
    assert others == [], others


@needs_gcc
def test_installed_plugin_answers_version(built: Built, node_bin: Path) -> None:
    result = install(built, node_bin)
    assert result.returncode == 0, result.stderr
    store = node_bin / "ipamd-cni.d"
    assert os.readlink(store / "current") == built.runtime_id
    answer = run_plugin(node_bin / "ipamd-cni", "VERSION")
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout)["supportedVersions"] == list(SUPPORTED_CNI_VERSIONS)


@needs_gcc
def test_installed_plugin_ignores_the_nodes_python_settings(
    built: Built, node_bin: Path, tmp_path: Path
) -> None:
    """A node's PYTHON* variables or a module shadowing the stdlib in the working directory change
    nothing: the launcher runs the interpreter isolated (-I) on its own libraries."""
    assert install(built, node_bin).returncode == 0
    trap = tmp_path / "trap"
    trap.mkdir()
    (trap / "json.py").write_text("raise SystemExit('the node shadowed json')\n")
    answer = subprocess.run(
        [str(node_bin / "ipamd-cni")],
        input="",
        env={"CNI_COMMAND": "VERSION", "PYTHONPATH": str(trap), "PYTHONHOME": str(trap)},
        cwd=trap,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert answer.returncode == 0, answer.stderr
    assert "supportedVersions" in answer.stdout


@needs_gcc
def test_installed_plugin_follows_the_cni_rules_when_ipamd_is_down(
    built: Built, node_bin: Path, tmp_path: Path
) -> None:
    assert install(built, node_bin).returncode == 0
    installed = sorted(p for p in (node_bin / "ipamd-cni.d").rglob("*"))
    conf = net_conf(tmp_path / "no-ipamd.sock")
    added = run_plugin(node_bin / "ipamd-cni", "ADD", conf)
    assert added.returncode != 0
    assert json.loads(added.stdout)["code"] == 11, "try again later"
    deleted = run_plugin(node_bin / "ipamd-cni", "DEL", conf)
    assert deleted.returncode == 0, "a DEL ipamd cannot act on succeeds"
    after = sorted(p for p in (node_bin / "ipamd-cni.d").rglob("*"))
    assert after == installed, "running the plugin writes nothing into the node's bin dir"


@needs_gcc
def test_reinstall_is_idempotent_and_an_upgrade_keeps_the_previous_runtime(
    built: Built, node_bin: Path, tmp_path: Path
) -> None:
    assert install(built, node_bin).returncode == 0
    assert install(built, node_bin).returncode == 0
    store = node_bin / "ipamd-cni.d"
    assert sorted(p.name for p in store.iterdir()) == sorted([built.runtime_id, "current"])

    def release(runtime_id: str) -> Path:
        copy = tmp_path / f"bundle-{runtime_id}"
        shutil.copytree(built.bundle, copy, symlinks=True)
        (copy / "ID").write_text(runtime_id + "\n")
        return copy

    assert install(built, node_bin, release("0000000000000002")).returncode == 0
    assert install(built, node_bin, release("0000000000000003")).returncode == 0
    assert os.readlink(store / "current") == "0000000000000003"
    kept = sorted(p.name for p in store.iterdir())
    assert kept == ["0000000000000002", "0000000000000003", "current"], "the first one went"
    assert run_plugin(node_bin / "ipamd-cni", "VERSION").returncode == 0


@needs_gcc
def test_install_refuses_a_node_without_the_reference_plugins(built: Built, node_bin: Path) -> None:
    (node_bin / "loopback").unlink()
    result = install(built, node_bin)
    assert result.returncode != 0
    assert "loopback is missing" in result.stderr
    assert sorted(p.name for p in node_bin.iterdir()) == ["portmap"], "nothing written"


@needs_gcc
def test_install_brings_the_images_portmap_only_to_a_node_without_one(
    built: Built, node_bin: Path, tmp_path: Path
) -> None:
    shipped = tmp_path / "image-plugins"
    shipped.mkdir()
    (shipped / "portmap").write_text("#!/bin/sh\necho image\n")
    (shipped / "portmap").chmod(0o755)
    (node_bin / "portmap").write_text("#!/bin/sh\necho node\n")
    assert install(built, node_bin, plugins=shipped).returncode == 0
    assert "node" in (node_bin / "portmap").read_text(), "the node's own copy is never replaced"

    (node_bin / "portmap").unlink()
    result = install(built, node_bin, plugins=shipped)
    assert result.returncode == 0, result.stderr
    assert "image" in (node_bin / "portmap").read_text()
    assert os.access(node_bin / "portmap", os.X_OK)
    assert "portmap installed from the image" in result.stderr


@needs_gcc
def test_install_refuses_a_node_without_portmap_when_the_image_has_none(
    built: Built, node_bin: Path
) -> None:
    (node_bin / "portmap").unlink()
    result = install(built, node_bin)
    assert result.returncode != 0
    assert "portmap is missing" in result.stderr


@needs_gcc
def test_launcher_without_its_runtime(built: Built, node_bin: Path) -> None:
    shutil.copy2(built.launcher, node_bin / "ipamd-cni")
    added = run_plugin(node_bin / "ipamd-cni", "ADD", net_conf(node_bin / "x.sock"))
    assert added.returncode == 1
    error = json.loads(added.stdout)
    assert error["code"] == 110 and "not installed" in error["msg"]
    deleted = run_plugin(node_bin / "ipamd-cni", "DEL", net_conf(node_bin / "x.sock"))
    assert deleted.returncode == 0, "DEL never keeps a pod Terminating"
    assert "leak GC" in deleted.stderr


# -- the probe --------------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    answers: ClassVar[dict[str, tuple[int, dict[str, str]]]] = {
        "/healthz": (200, {"status": "ok"}),
        "/readyz": (503, {"code": "not_ready"}),
    }

    def do_GET(self) -> None:
        status, body = self.answers.get(self.path, (404, {"code": "not_found"}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: object) -> None:
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def fake_ipamd(tmp_path: Path) -> Iterator[Path]:
    """A unix-socket HTTP server answering /healthz 200 and /readyz 503, as ipamd before ready."""
    path = tmp_path / "ipamd.sock"
    server = _UnixServer(str(path), _Handler)
    thread = threading.Thread(target=server.serve_forever, name="fake-ipamd", daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def run_probe(path: str, socket: Path) -> subprocess.CompletedProcess[str]:
    env = {"IPAMD_SOCKET": str(socket)}
    return subprocess.run(
        [sys.executable, "-I", str(PROBE), path],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def test_probe_passes_on_200_and_fails_otherwise(fake_ipamd: Path) -> None:
    healthy = run_probe("/healthz", fake_ipamd)
    assert healthy.returncode == 0, healthy.stdout
    unready = run_probe("/readyz", fake_ipamd)
    assert unready.returncode == 1
    assert "503" in unready.stdout and "not_ready" in unready.stdout


def test_probe_fails_when_nothing_listens(tmp_path: Path) -> None:
    result = run_probe("/healthz", tmp_path / "absent.sock")
    assert result.returncode == 1
    assert "absent.sock" in result.stdout


def test_probe_refuses_other_paths(tmp_path: Path) -> None:
    assert run_probe("/v1/pool", tmp_path / "ipamd.sock").returncode == 2


# -- the Dockerfile and its pins ---------------------------------------------------------------------


def runtime_closure() -> dict[str, str]:
    """Every distribution ipamd needs at run time (pyproject's dependencies, then theirs, markers
    evaluated for this Python), by canonical name, with the version installed here."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    found: dict[str, str] = {}

    def walk(requirement: Requirement) -> None:
        name = canonicalize_name(requirement.name)
        if name in found:
            return
        found[name] = distribution(requirement.name).version
        for text in distribution(requirement.name).requires or []:
            sub = Requirement(text)
            extras = ("", *requirement.extras)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                walk(sub)

    for text in pyproject["project"]["dependencies"]:
        walk(Requirement(text))
    return found


def constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in (IMAGE_DIR / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_constraints_pin_exactly_the_runtime_closure() -> None:
    try:
        closure = runtime_closure()
    except PackageNotFoundError as missing:
        pytest.fail(f"a runtime dependency is not installed: {missing}")
    assert set(constraints()) == set(closure)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    for text in pyproject["project"]["dependencies"]:
        direct = Requirement(text)
        (spec,) = direct.specifier
        assert spec.operator == "=="
        assert constraints()[canonicalize_name(direct.name)] == spec.version


def test_dockerfile_copies_only_what_the_build_context_holds() -> None:
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
            continue
        for source in words[1:-1]:
            assert (REPO / source).exists(), source
            assert any(source == a or source.startswith(a + "/") for a in allowed), source
