"""The plugin a node runs, built and installed here as the image builds it and its init container
installs it: the runtime bundled from this interpreter (`deploy/image/build_cni_bundle.py`), the
static launcher (`deploy/image/cni-launcher.c`), and `deploy/image/install-cni.sh` putting both in a
CNI bin dir. Also `link_static`, which links the launcher and the benches' other small C programs.

It measures nothing and touches nothing outside the directories it is given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

IMAGE_DIR = Path(__file__).resolve().parents[1] / "deploy" / "image"


def build_bundle(workdir: Path) -> Path:
    """The plugin's runtime in `workdir/bundle`, as the image's build stage makes it."""
    bundle = workdir / "bundle"
    built = subprocess.run(
        [sys.executable, str(IMAGE_DIR / "build_cni_bundle.py"), str(bundle)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if built.returncode != 0:
        raise RuntimeError(f"the plugin's runtime does not build: {built.stderr.strip()}")
    return bundle


def link_static(source: Path, out: Path, *defines: str) -> str | None:
    """Compiles and links `source` statically into `out` (`-D` each of `defines`): None once
    done, else why it could not be (no gcc, or gcc's complaint)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return "gcc absent"
    compiled = subprocess.run(
        [gcc, "-static", "-Os", "-s", *(f"-D{d}" for d in defines), "-o", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if compiled.returncode != 0:
        return f"gcc cannot link {source.name} statically\n{compiled.stderr.strip()}"
    return None


def bin_dir_of(workdir: Path) -> Path:
    """The CNI bin dir `install` installs into: `ipamd-cni` and its runtime, `ipamd-cni.d`."""
    return workdir / "cni-bin"


def install(workdir: Path, bundle: Path) -> Path | str:
    """The launcher, linked statically, and `bundle` installed by `install-cni.sh` into the bin
    dir `workdir/cni-bin`: the installed `ipamd-cni`, or why it could not be built."""
    launcher = workdir / "launcher" / "ipamd-cni"
    launcher.parent.mkdir()
    why = link_static(IMAGE_DIR / "cni-launcher.c", launcher)
    if why is not None:
        return why
    bin_dir = bin_dir_of(workdir)
    bin_dir.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "IPAMD_CNI_BIN_DIR": str(bin_dir),
        "IPAMD_CNI_BUNDLE": str(bundle),
        "IPAMD_CNI_LAUNCHER": str(launcher),
        "IPAMD_CNI_REQUIRED_PLUGINS": "",  # the node's own plugins are not checked here
    }
    subprocess.run(
        ["/bin/sh", str(IMAGE_DIR / "install-cni.sh")],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return bin_dir / "ipamd-cni"
