"""How the image is built, read without a container engine: the Dockerfile installs the dependencies
from the pins alone before any code arrives (a code change reuses that layer), installs ipamd itself
offline, and its pip step gets the builder's pip settings as build secrets, filtered by
deploy/image/pip_build_secrets.py to what reaches the network. `make test-image` builds it for real."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.deploy.repo import DOCKERFILE, IMAGE_DIR, REPO, load_image_script

secrets = load_image_script("pip_build_secrets")


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, rest), continuation lines joined."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found: list[tuple[str, str]] = []
    for line in joined.splitlines():
        words = line.strip().split(maxsplit=1)
        if words and not words[0].startswith("#"):
            found.append((words[0], words[1] if len(words) > 1 else ""))
    return found


def build_stage() -> list[tuple[str, str]]:
    steps = instructions()
    froms = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    return steps[froms[0] : froms[1]]


def test_dependencies_install_from_the_pins_before_any_code_is_copied() -> None:
    steps = build_stage()
    (deps,) = [i for i, (k, rest) in enumerate(steps) if k == "RUN" and "constraints.txt" in rest]
    copied_before = [rest.split()[:-1] for k, rest in steps[:deps] if k == "COPY"]
    assert copied_before == [["deploy/image/constraints.txt", "deploy/image/build-system.txt"]]
    assert "--requirement deploy/image/constraints.txt" in steps[deps][1]
    assert "--mount=type=secret,id=pip_conf" in steps[deps][1]
    assert "PIP_CONFIG_FILE=/run/secrets/pip_conf" in steps[deps][1]
    code = [i for i, (k, rest) in enumerate(steps) if k == "COPY" and rest.startswith("ipamd ")]
    assert code and code[0] > deps


def test_ipamd_itself_installs_offline_on_the_pinned_build_backend() -> None:
    (install,) = [
        rest for k, rest in build_stage() if k == "RUN" and "install" in rest and " . " in rest
    ]
    for flag in ("--no-index", "--no-deps", "--no-build-isolation"):
        assert flag in install
    assert "pip check" in install
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = [
        line.strip()
        for line in (IMAGE_DIR / "build-system.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert pins == pyproject["build-system"]["requires"]


def test_the_run_steps_call_python3_which_every_python_base_has() -> None:
    for keyword, rest in instructions():
        if keyword == "RUN":
            assert not re.search(r"(^|\s)python(\s|$)", rest), rest


LISTING = """\
:env:.cert='/etc/ssl/certs/bundle.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/ignored/because/env/wins.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple https://mirror.test/simple'
global.index-url='https://pypi.mirror.test/simple'
install.index-url='https://install.mirror.test/simple'
global.trusted-host='mirror.test'
"""


def test_settings_take_the_highest_precedence_source() -> None:
    settings = secrets.pip_settings(LISTING)
    assert settings["cert"] == "/etc/ssl/certs/bundle.crt", "PIP_* variables win over files"
    assert settings["index-url"] == "https://install.mirror.test/simple", "[install] over [global]"


def test_only_what_reaches_the_network_is_passed() -> None:
    kept = secrets.forwarded(secrets.pip_settings(LISTING))
    assert kept == {
        "index-url": "https://install.mirror.test/simple",
        "extra-index-url": "https://mirror.test/simple",
        "trusted-host": "mirror.test",
        "default-timeout": "180",
    }, "no local path, no file: URL, no constraint"


def test_secrets_files_and_flags(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    out = tmp_path / "out"
    out.mkdir()
    flags = secrets.write_secrets(out, {"index-url": "https://mirror.test/simple"}, bundle)
    assert flags == [
        f"--secret=id=pip_conf,src={out / 'pip.conf'}",
        f"--secret=id=pip_cert,src={out / 'ca.pem'}",
    ]
    conf = (out / "pip.conf").read_text()
    assert conf == (
        "[global]\nindex-url = https://mirror.test/simple\ncert = /run/secrets/pip_cert\n"
    )
    assert (out / "ca.pem").read_text() == bundle.read_text()


def test_nothing_to_pass_means_no_flag(tmp_path: Path) -> None:
    assert secrets.write_secrets(tmp_path, {"find-links": "/opt/wheels"}, None) == []
    assert list(tmp_path.iterdir()) == []


def test_the_certificate_bundle_is_pips_then_the_environments(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine.pem", tmp_path / "other.pem"
    mine.write_text("x")
    other.write_text("y")
    assert secrets.certificate_bundle({"cert": str(mine)}, {"SSL_CERT_FILE": str(other)}) == mine
    assert secrets.certificate_bundle({"cert": "/absent"}, {"SSL_CERT_FILE": str(other)}) == other


def test_the_script_prints_flags_for_this_builder(tmp_path: Path) -> None:
    answer = subprocess.run(
        [sys.executable, str(IMAGE_DIR / "pip_build_secrets.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    for flag in answer.stdout.split():
        assert flag.startswith("--secret=id=pip_"), flag
        assert Path(flag.split("src=", 1)[1]).is_file()


def test_ci_runs_the_image_smoke_test_as_root_and_the_docs_give_its_figures() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test-image" in ci and "id -u" in ci
    assert re.search(
        r"^test-image: .*\n\ttests/image/run.sh$", (REPO / "Makefile").read_text(), re.M
    )
    operations = (REPO / "docs" / "operations.md").read_text()
    for figure in ("make test-image", "`image_size_mib`", "build from scratch", "from the cache"):
        assert figure in operations, figure


def _c_strings(text: str) -> str:
    """The C string literals in `text`, concatenated and unescaped as the compiler would."""
    return "".join(
        bytes(s, "ascii").decode("unicode_escape") for s in re.findall(r'"((?:[^"\\]|\\.)*)"', text)
    )


def test_the_launcher_starts_the_plugin_as_the_bundle_build_checks_it() -> None:
    """cni-launcher.c and build_cni_bundle.py each spell the interpreter's flags and the plugin's
    entry (C and Python cannot share them): the build's import budget and the bundle tests are
    measured on what the node really runs only while the two agree."""
    source = (IMAGE_DIR / "cni-launcher.c").read_text()
    define = re.search(r"#define ENTRY((?:.*\\\n)*.*)\n", source)
    assert define is not None
    bundle = load_image_script("build_cni_bundle")
    assert _c_strings(define.group(1)) == bundle.ENTRY
    argv = re.search(r"char \*argv\[\] = \{loader, (.*)\};", source)
    assert argv is not None
    launched = re.findall(r'"([^"]*)"', argv.group(1).split("ENTRY")[0])
    # runtime_command: ld.so --library-path <lib> <python3> <flags...>
    assert launched == ["--library-path", *bundle.runtime_command(Path("/r"))[4:], "-c"]
