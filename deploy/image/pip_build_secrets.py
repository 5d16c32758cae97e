"""Hands the image build the builder's pip configuration: its index and its certificate bundle.

The image's dependency step runs pip inside the build, where the builder's pip configuration (files,
PIP_* variables) does not reach. A builder behind a package mirror or a TLS-intercepting proxy needs
that step to use the same index and trust the same certificates, and neither belongs in the image or
in the repository. So `make image` runs this script, which writes into DIR (a fresh private directory
that the Makefile removes afterwards):

    DIR/pip.conf    the settings below, as the builder's pip sees them
    DIR/ca.pem      the certificate bundle the builder's pip verifies TLS with

and prints the build flags that pass them as build secrets, which the Dockerfile's dependency step
mounts (`--mount=type=secret`): `--secret id=pip_conf,src=DIR/pip.conf --secret
id=pip_cert,src=DIR/ca.pem`. Podman and Docker's BuildKit read the same flags. Secrets are never
stored in a layer, and the step's cache key does not depend on them.

Only what reaches the network is passed: index-url, extra-index-url, find-links, trusted-host,
proxy, timeout and retries. Local paths and `file:` URLs are dropped (the build cannot see the
builder's disk), and so are constraints (the image has its own, deploy/image/constraints.txt). The
certificate bundle is pip's `cert` when set, else the one named by REQUESTS_CA_BUNDLE or
SSL_CERT_FILE, else OpenSSL's default file when it exists. With nothing to pass (no pip on the
builder, no setting) it prints nothing and the build uses pip's defaults.

Usage: python pip_build_secrets.py DIR
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

FORWARDED = (
    "index-url",
    "extra-index-url",
    "find-links",
    "trusted-host",
    "proxy",
    "timeout",
    "default-timeout",
    "retries",
)
"""pip settings that the build's pip gets from the builder's."""
LISTS = frozenset({"extra-index-url", "find-links", "trusted-host"})
"""Settings whose value is a whitespace-separated list."""
LOCATIONS = frozenset({"index-url", "extra-index-url", "find-links"})
"""Settings naming places to read packages from: only network URLs pass."""
SECTIONS = (":env:", "install", "global")
"""Where `pip config list` reports a setting, highest precedence first (PIP_* variables, then the
files' [install] and [global] sections)."""
CERT_IN_BUILD = "/run/secrets/pip_cert"
"""Where the build step finds the bundle (the secret `pip_cert`, mounted at BuildKit's and Podman's
default place)."""


def pip_settings(listing: str) -> dict[str, str]:
    """`pip config list`'s lines (`section.key='value'`) as key → value, the highest-precedence
    section winning; keys under `:env:` are PIP_* variables, named as pip names the option."""
    found: dict[str, dict[str, str]] = {section: {} for section in SECTIONS}
    for line in listing.splitlines():
        name, sep, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in found:
            continue
        value = raw.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[section][key.replace("_", "-")] = value
    settings: dict[str, str] = {}
    for section in reversed(SECTIONS):
        settings.update(found[section])
    return settings


def _is_network_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def forwarded(settings: dict[str, str]) -> dict[str, str]:
    """The settings the build's pip gets: `FORWARDED` only, local locations dropped."""
    kept: dict[str, str] = {}
    for key in FORWARDED:
        value = settings.get(key, "").strip()
        if not value:
            continue
        if key in LISTS:
            items = value.split()
            if key in LOCATIONS:
                items = [item for item in items if _is_network_url(item)]
            value = " ".join(items)
        elif key in LOCATIONS and not _is_network_url(value):
            value = ""
        if value:
            kept[key] = value
    return kept


def certificate_bundle(settings: dict[str, str], environ: dict[str, str]) -> Path | None:
    """The bundle the builder's pip verifies TLS with, if there is one on disk."""
    candidates = [
        settings.get("cert", ""),
        environ.get("REQUESTS_CA_BUNDLE", ""),
        environ.get("SSL_CERT_FILE", ""),
        ssl.get_default_verify_paths().cafile or "",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def builder_settings(python: str) -> dict[str, str]:
    """What `python -m pip config list` reports; empty when that pip is missing or fails."""
    try:
        answer = subprocess.run(
            [python, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return pip_settings(answer.stdout) if answer.returncode == 0 else {}


def write_secrets(dest: Path, settings: dict[str, str], bundle: Path | None) -> list[str]:
    """Writes DIR's files; returns the build flags that pass them (none when there is nothing)."""
    lines = [f"{key} = {value}" for key, value in forwarded(settings).items()]
    flags: list[str] = []
    if bundle is not None:
        shutil.copyfile(bundle, dest / "ca.pem")
        lines.append(f"cert = {CERT_IN_BUILD}")
        flags.append(f"--secret=id=pip_cert,src={dest / 'ca.pem'}")
    if lines:
        (dest / "pip.conf").write_text("[global]\n" + "\n".join(lines) + "\n")
        flags.insert(0, f"--secret=id=pip_conf,src={dest / 'pip.conf'}")
    return flags


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[1]).is_dir():
        print("usage: pip_build_secrets.py DIR (an existing directory)", file=sys.stderr)
        return 2
    settings = builder_settings(sys.executable)
    bundle = certificate_bundle(settings, dict(os.environ))
    print(" ".join(write_secrets(Path(argv[1]), settings, bundle)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
