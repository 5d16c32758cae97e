"""A Kubernetes API server for tests and benches: a real HTTP(S) server on 127.0.0.1 that ipamd's
client talks to as to the real one (issue 39), in the caller's own event loop or, for a daemon
started as a process, on a loop in a thread of its own (`server.KubeApiServer`).

It lives here rather than under `tests/` because benches import nothing from `tests/` (the import
contract) and benches run ipamd against it too (`bench.pod_aware`, `bench.api`); its own tests
stay in `tests/unit/kube_api/`.

Why not KMock (PyPI `kmock`, 0.8, tried): it keeps objects and streams watches, but serves no
resourceVersion (objects have none; a list answers `"..."`), ignores `resourceVersion` on a watch
(every watch replays all objects as ADDED), sends no bookmarks and no 410, ignores `timeoutSeconds`,
`fieldSelector` and `labelSelector` (a list by `spec.nodeName` answers every node's pods), merges
every PATCH as a plain dict merge whatever its content type (no strategic merge; a failed JSON
patch `test` is a 500, not 422), validates nothing, knows no bearer token, and has no TLS. Each of
those is what ipamd's client must be tested against, so this server is built on aiohttp instead.

Use::

    async with KubeApiServer(tmp_path / "kube") as api:        # in the test's loop
        api.add_node("ip-10-0-0-10", max_pods=29, taints=["ipamd.k8s.aws/agent-not-ready:NoSchedule"])
        api.add_pod("web-1", node="ip-10-0-0-10")
        ... KUBECONFIG=api.kubeconfig ...

    with KubeApiServer(tmp_path / "kube", tls=True) as api:    # on its own thread: for a process
        daemon = start_daemon(env={"KUBECONFIG": str(api.kubeconfig)})

The tests' fixtures `kube_api` (plain HTTP), `kube_api_tls` (HTTPS when `cryptography` is installed,
else skipped) and `kube_api_thread` (on its own thread) are in `tests/support/kube_api.py`.
`api.kubeconfig` is a kubeconfig file (JSON, which is YAML) naming the server, its CA
(`certificate-authority`) when TLS, and the bearer token (`token`, or `tokenFile` with
`token_file=True`).

What it serves, as the real server does (`paths`, `rest`, `kinds`, `store`, `patch`):
- Nodes, pods (`/api/v1/namespaces/<ns>/pods` and all namespaces' `/api/v1/pods`), core and
  events.k8s.io/v1 Events, and ENIConfigs (`crd.k8s.amazonaws.com/v1alpha1`, cluster-scoped):
  GET, list, watch, POST, PATCH, PUT, DELETE; the `status` subresource of pods and nodes (a patch
  of the main resource keeps the status, as their strategies do).
- One cluster-wide revision: every object has `metadata.resourceVersion` (a string), `uid` and
  `creationTimestamp`; a list carries the revision it was taken at; `limit`/`continue` page it.
- `fieldSelector` (metadata.name and .namespace on every kind; spec.nodeName, spec.hostNetwork,
  status.phase, ... on pods; spec.unschedulable on nodes; an unsupported field is 400) and
  `labelSelector` (equality, existence, in/notin) on lists and watches.
- Watches (`watch=1`): newline-delimited `{"type", "object"}` events from `resourceVersion` on
  (unset or "0": the current objects first, as ADDED); an object that starts or stops matching
  the selector is ADDED or DELETED; `allowWatchBookmarks=true` gets a BOOKMARK every
  `bookmark_interval_s` and on `send_bookmarks()`; `sendInitialEvents=true` ends the initial
  ADDED with the `k8s.io/initial-events-end` bookmark; `timeoutSeconds` ends the stream cleanly.
  A resourceVersion older than the last `history_window` changes gets an ERROR event with a
  Status 410 (Expired) and the end of the stream.
- PATCH as merge, strategic merge and JSON patch (`patch` says how each treats the taints).
  A refused patch answers the real server's Status: 409 on a resourceVersion precondition, 422
  on a failed JSON patch op, 415 on another content type.
- Admission (`schemas`): every object created, patched or replaced is validated against
  the Kubernetes schemas kubernetes-validate ships (strict: an unknown field is an error) or,
  for an ENIConfig, against VPC CNI's CRD (pruned first); an invalid one is 422 Invalid with
  each cause. The seed helpers validate too (`validate=False` to store a bad object on purpose).
- Authentication: `Authorization: Bearer <token>`; a wrong token is 401, none is 403 but for
  /version, /healthz, /livez and /readyz.

Seeds (sync, thread-safe; each returns the stored object): `add_node`, `add_pod`, `bind_pod`
(what the scheduler's binding does), `set_pod_phase`, `delete_pod`, `add_eniconfig`, and for any
kind of `kinds` `create(kind, obj)`, `update(kind, key, change)`, `delete(kind, key)`;
`add_bulk(pods=100_000, eniconfigs=5_000)` adds issue 39's memory population cheaply (generated
from an index on demand, `objects`). Reads: `node(name)`, `pod(ns, name)`,
`eniconfig(name)`, `events()`, `objects(kind)`.

Knobs (sync, thread-safe unless marked async):
- `throttle(times, retry_after_s=1, match=None)`: the next `times` matching requests get 429
  with `Retry-After` (and `details.retryAfterSeconds`).
- `fail(times, status=503, match=None)`: the next `times` matching requests get a 5xx Status.
- `slow(delay_s, times=None, match=None)`: matching requests wait before being answered (all of
  them until `clear_faults()` when `times` is None).
- `clear_faults()`.
- `drop_watches()`: cuts every open watch's connection mid-stream; `end_watches()` ends them
  cleanly; both answer how many. `send_bookmarks()` sends a BOOKMARK on every open watch that
  allows them.
- `expire_history()`: a compaction at the current revision: every older resourceVersion becomes
  too old (a watch or a `continue` from one gets 410); `history_window` (constructor) is how many
  changes are kept.
- `await down()` / `await up()`: stop serving (the port refuses connections, open ones are cut) and
  serve again on the same port; `KubeApiServer(serving=False)` starts down (the kubeconfig is
  written with its port all the same).
- `rotate_token()`: a new token; the old one gets 401 from then on; the token file and the
  kubeconfig are rewritten.
- `await wait_for_watches(n, match=None)`: until n watches are open; `watch_count(match)`
  (their `match` is a predicate on the watched `Kind`).
- The faults' `match` is a predicate on a `RecordedRequest` (`is_watch`, `kind_plural`,
  `method`, `path`, `field_selector`); faults apply in the order they were added, and a delay
  adds to a status fault.
- `call(coroutine)` runs an async knob from another thread (for `kube_api_thread`).

A request is recorded, then delayed, then answered by a fault, else refused by authentication,
else served. Every request is recorded, in order, in `requests` (`recorded.RecordedRequest`:
method, path, query, headers with lower-case names, body, and the status answered), faults and
refusals included; `requests_for(plural, method=None)` filters them.
"""
