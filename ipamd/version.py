"""The version of ipamd that is installed, as `ipamd --version`, `ipamctl --version` and the
`awscni_build_info` metric say it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def installed() -> str:
    """The package's version; `unknown` when run from a source tree that was never installed."""
    try:
        return version("ipamd")
    except PackageNotFoundError:
        return "unknown"
