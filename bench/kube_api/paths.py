"""Where a request to the test API server (`bench.kube_api.server`) goes, and how it is refused:
the kind, namespace, name and subresource a path names (`/api/v1/...` and
`/apis/<group>/<version>/...`, then `[namespaces/<ns>/]<plural>[/<name>[/status]]` for the kinds of
`kinds.KINDS`), the discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`), the
paths served without a token, and the Status of every refusal, as the real API server words it.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from bench.kube_api.kinds import KINDS, Kind, Obj

PUBLIC_PATHS = frozenset({"/version", "/healthz", "/livez", "/readyz"})


def status_body(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def status_response(
    code: int,
    reason: str,
    message: str,
    *,
    details: Obj | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        status_body(code, reason, message, details), status=code, headers=headers
    )


@dataclass(frozen=True, slots=True)
class Target:
    kind: Kind
    namespace: str
    name: str
    subresource: str


def parse_target(path: str) -> Target | None:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    kind = KINDS.get((group, version, rest[0])) if 1 <= len(rest) <= 3 else None
    if kind is None or (namespace and not kind.namespaced):
        return None
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if subresource and not (subresource == "status" and kind.status_subresource):
        return None
    return Target(kind, namespace, name, subresource)


def not_found(path: str) -> web.Response:
    return status_response(
        404, "NotFound", "the server could not find the requested resource", details={"path": path}
    )


def discovery(path: str) -> Obj | None:
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"]}
    groups = sorted({(k.group, k.version) for k in KINDS.values() if k.group})
    if path == "/apis":
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                    "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                }
                for g, v in groups
            ],
        }
    for group, version in [("", "v1"), *groups]:
        prefix = f"/apis/{group}/{version}" if group else "/api/v1"
        if path == prefix:
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": [
                    {
                        "name": k.plural,
                        "kind": k.kind,
                        "namespaced": k.namespaced,
                        "singularName": k.kind.lower(),
                        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                    }
                    for k in KINDS.values()
                    if (k.group, k.version) == (group, version)
                ],
            }
    return None
