"""The plugin's runtime builds from any CPython layout, Debian's included.

Debian's python3 (and so any image built on Debian's own Python) never puts `lib/pythonX.Y/
site-packages` on `sys.path`: its `site` module looks in `dist-packages` only. A runtime that relied
on `site-packages` would build from the official python image and fail from Debian's with
`ModuleNotFoundError: No module named 'ipamd'`. Here the bundle is built from such an interpreter when
the machine has one (Debian's /usr/bin/python3), with `ipamd` reached through PYTHONPATH as in a
checkout, and the runtime must import the plugin on its own, as the launcher starts it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ipamd.wire import SUPPORTED_CNI_VERSIONS
from tests.deploy.repo import IMAGE_DIR, REPO, load_image_script

CANDIDATES = ("/usr/bin/python3",)
_LAYOUT_PROBE = (
    "import site, sys\n"
    "print(sys.version_info >= (3, 11))\n"
    "print(' '.join(site.getsitepackages()))\n"
)


def dist_packages_python() -> str | None:
    """An interpreter (3.11 or newer) whose `site` adds `dist-packages` directories and no
    `site-packages` one: Debian's layout."""
    for candidate in CANDIDATES:
        if not Path(candidate).is_file():
            continue
        answer = subprocess.run(
            [candidate, "-I", "-c", _LAYOUT_PROBE],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        lines = answer.stdout.splitlines()
        if answer.returncode != 0 or len(lines) != 2 or lines[0] != "True":
            continue
        dirs = lines[1].split()
        if any(d.endswith("dist-packages") for d in dirs) and not any(
            d.endswith("site-packages") for d in dirs
        ):
            return candidate
    return None


DEBIAN_PYTHON = dist_packages_python()


@pytest.mark.skipif(DEBIAN_PYTHON is None, reason="no Debian-style python3 (>= 3.11) here")
def test_runtime_built_from_a_dist_packages_python_imports_the_plugin(tmp_path: Path) -> None:
    assert DEBIAN_PYTHON is not None
    bundle = tmp_path / "bundle"
    built = subprocess.run(
        [DEBIAN_PYTHON, str(IMAGE_DIR / "build_cni_bundle.py"), str(bundle)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    bundle_build = load_image_script("build_cni_bundle")
    # As the launcher starts it (its flags and entry are the build script's: test_image_build).
    answer = subprocess.run(
        [*bundle_build.runtime_command(bundle), "-c", bundle_build.ENTRY],
        input="",
        capture_output=True,
        text=True,
        check=False,
        env={"CNI_COMMAND": "VERSION"},
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout)["supportedVersions"] == list(SUPPORTED_CNI_VERSIONS)
