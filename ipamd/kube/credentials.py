"""Where the Kubernetes API server is and how ipamd proves who it is: in the cluster, the pod's
service account (`KUBERNETES_SERVICE_HOST`/`_PORT`, the projected token, re-read on every request
because the kubelet rotates it, and the cluster's CA); elsewhere a kubeconfig (`KUBECONFIG`): its
current context's cluster (server, CA file or data, or skipping TLS verification) and user (a token
or a token file; client certificates are read too).

Pure but for reading the files named: no network. `CredentialsError` says what is missing.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipamd.config.kinds import host_literal

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CredentialsError(ValueError):
    """No way to reach the API server could be found, or its files are not usable."""


@dataclass(frozen=True, slots=True)
class Credentials:
    server: str
    """`https://host:port` (or `http://` for a test server)."""
    token: str = ""
    token_file: str = ""
    """Read on every request when set: a projected token is rotated by the kubelet."""
    ca_file: str = ""
    insecure: bool = False
    client_cert: str = ""
    client_key: str = ""
    source: str = ""
    """Where these came from, for the log: `in-cluster` or the kubeconfig's path."""

    def bearer(self) -> str:
        """The token to send now ("" for none)."""
        if self.token_file:
            try:
                return Path(self.token_file).read_text(encoding="utf-8").strip()
            except OSError as err:
                raise CredentialsError(f"token file {self.token_file}: {err.strerror}") from None
        return self.token

    def ssl_context(self) -> ssl.SSLContext | bool:
        """What aiohttp verifies the server with: the CA, or nothing when told to skip it."""
        if not self.server.startswith("https://"):
            return False
        if self.insecure:
            return False
        context = ssl.create_default_context(cafile=self.ca_file or None)
        if self.client_cert:
            context.load_cert_chain(self.client_cert, self.client_key or None)
        return context


def find(environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT) -> Credentials | None:
    """The credentials the environment offers: a kubeconfig named by `KUBECONFIG` first (an
    operator's explicit choice), else the pod's service account; None when there is neither."""
    kubeconfig = environ.get("KUBECONFIG", "")
    if kubeconfig:
        return from_kubeconfig(Path(kubeconfig.split(os.pathsep)[0]))
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT")
    token = service_account / "token"
    if host and token.exists():
        ca = service_account / "ca.crt"
        return Credentials(
            server=f"https://{host_literal(host)}:{port or '443'}",
            token_file=str(token),
            ca_file=str(ca) if ca.exists() else "",
            source="in-cluster",
        )
    return None


def from_kubeconfig(path: Path) -> Credentials:
    """The current context of the kubeconfig at `path`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise CredentialsError(f"kubeconfig {path}: {err.strerror}") from None
    doc = _load(text, path)
    if not isinstance(doc, dict):
        raise CredentialsError(f"kubeconfig {path}: not a kubeconfig")
    context = _named(doc, "contexts", doc.get("current-context"), path)
    cluster = _named(doc, "clusters", context.get("cluster"), path)
    user = _named(doc, "users", context.get("user"), path) if context.get("user") else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise CredentialsError(f"kubeconfig {path}: the cluster has no server URL")
    return Credentials(
        server=server.rstrip("/"),
        token=str(user.get("token") or ""),
        token_file=str(user.get("tokenFile") or ""),
        ca_file=_file(cluster, "certificate-authority", path),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        client_cert=_file(user, "client-certificate", path),
        client_key=_file(user, "client-key", path),
        source=str(path),
    )


def _load(text: str, path: Path) -> object:
    """A kubeconfig's document: JSON (which kubectl reads too) without any library, YAML with
    PyYAML where it is installed (a node's ipamd uses its service account and needs neither)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        raise CredentialsError(
            f"kubeconfig {path}: not JSON, and PyYAML is not installed to read YAML"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise CredentialsError(f"kubeconfig {path}: not YAML: {err}") from None


def _named(doc: dict[str, Any], kind: str, name: object, path: Path) -> dict[str, Any]:
    for item in doc.get(kind) or ():
        if isinstance(item, dict) and item.get("name") == name:
            body = item.get(kind[:-1])
            if isinstance(body, dict):
                return body
    raise CredentialsError(f"kubeconfig {path}: no {kind[:-1]} named {name!r}")


def _file(section: dict[str, Any], key: str, path: Path) -> str:
    """A file the kubeconfig names (relative to the kubeconfig) or carries inline (`key-data`)."""
    named = section.get(key)
    if isinstance(named, str) and named:
        return str((path.parent / named) if not os.path.isabs(named) else Path(named))
    data = section.get(f"{key}-data")
    if isinstance(data, str) and data:
        written = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the process
            prefix="ipamd-kube-", suffix=".pem", delete=False
        )
        with written:
            written.write(base64.b64decode(data))
        return written.name
    return ""
