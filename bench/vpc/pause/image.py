"""The pause image of the end-to-end tests and the benches, built without a registry: `pause.c`
compiled static and packed as an OCI image-layout tarball that `ctr images import` takes.

The tarball holds `oci-layout`, `index.json` (one manifest, named by the `io.containerd.image.name`
annotation, which is what `ctr images import` names the image by) and the blobs: a gzipped layer
with `/pause`, the image config (entrypoint `/pause`, this machine's OS and architecture) and the
manifest. Every timestamp is zero, so the same binary gives the same digests.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import platform
import shutil
import subprocess
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "pause.c"
PAUSE_IMAGE = "localhost/ipamd-e2e/pause:1"
"""The sandbox image: built locally, imported into containerd, never pulled."""

_MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
_MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
_MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}


def oci_architecture() -> str:
    """This machine's architecture as OCI (and GOARCH) names it; `ctr images import` unpacks only
    images of the local platform."""
    machine = platform.machine()
    return _ARCHITECTURES.get(machine, machine)


def compile_pause(out: Path) -> Path:
    """Compiles `pause.c` into a static binary at `out`. Raises `FileNotFoundError` without gcc and
    `subprocess.CalledProcessError` (with gcc's stderr) when it fails, e.g. without libc6-dev."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FileNotFoundError("gcc is not installed (apt-get install gcc libc6-dev)")
    subprocess.run(
        [gcc, "-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


def _layer(binary: Path) -> bytes:
    """An uncompressed tar with `binary` as `/pause` (root-owned, mode 0755, mtime 0)."""
    data = binary.read_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("pause")
        info.size = len(data)
        info.mode = 0o755
        info.mtime = 0
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _descriptor(media_type: str, blob: bytes) -> dict[str, object]:
    return {
        "mediaType": media_type,
        "digest": f"sha256:{hashlib.sha256(blob).hexdigest()}",
        "size": len(blob),
    }


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def pack_oci_archive(binary: Path, name: str, out: Path) -> Path:
    """Writes an OCI image-layout tarball at `out` holding one image, `name` (a full reference such
    as `localhost/ipamd-e2e/pause:1`), whose only file is `binary` as `/pause`."""
    layer = _layer(binary)
    layer_gz = gzip.compress(layer, mtime=0)
    config = _json(
        {
            "architecture": oci_architecture(),
            "os": "linux",
            "config": {"Entrypoint": ["/pause"]},
            "rootfs": {
                "type": "layers",
                "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"],
            },
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": _MEDIA_MANIFEST,
            "config": _descriptor(_MEDIA_CONFIG, config),
            "layers": [_descriptor(_MEDIA_LAYER, layer_gz)],
        }
    )
    tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else "latest"
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": _MEDIA_INDEX,
            "manifests": [
                {
                    **_descriptor(_MEDIA_MANIFEST, manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
    )
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _add(tar, "index.json", index)
        for blob in (layer_gz, config, manifest):
            _add(tar, f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}", blob)
    return out


def build_pause_image(workdir: Path, name: str) -> Path:
    """Compiles the pause program in `workdir` and packs it as image `name`; returns the tarball."""
    binary = compile_pause(workdir / "pause")
    return pack_oci_archive(binary, name, workdir / "pause-image.tar")
