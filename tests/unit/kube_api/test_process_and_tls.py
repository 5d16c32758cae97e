"""The test API server as a daemon process meets it: on its own thread, over HTTPS with a CA made
at test time, reached through the kubeconfig it writes (`KUBECONFIG`), its knobs driven from the
test's thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import aiohttp
import pytest

from bench.kube_api.tls import tls_available
from tests.support.kube_api import KubeApiServer

NODE = "ip-10-0-0-10"

# A client of the standard library only, as a separate process: reads $KUBECONFIG (its current
# context's server, CA and token or token file), GETs each path given and prints status and body.
CLIENT = textwrap.dedent(
    """
    import json, os, ssl, sys, urllib.error, urllib.request
    config = json.load(open(os.environ["KUBECONFIG"]))
    context = {c["name"]: c["context"] for c in config["contexts"]}[config["current-context"]]
    cluster = {c["name"]: c["cluster"] for c in config["clusters"]}[context["cluster"]]
    user = {u["name"]: u["user"] for u in config["users"]}[context["user"]]
    token = user.get("token") or open(user["tokenFile"]).read().strip()
    tls = ssl.create_default_context(cafile=cluster.get("certificate-authority"))
    for path in sys.argv[1:]:
        bearer = {"Authorization": "Bearer " + token}
        request = urllib.request.Request(cluster["server"] + path, headers=bearer)
        try:
            with urllib.request.urlopen(request, context=tls, timeout=10) as answer:
                print(json.dumps([answer.status, json.load(answer)]))
        except urllib.error.HTTPError as refused:
            print(json.dumps([refused.code, json.load(refused)]))
    """
)


def run_client(kubeconfig: Path, *paths: str) -> list[list[object]]:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, *paths],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


needs_tls = pytest.mark.skipif(not tls_available(), reason="cryptography is not installed")


@needs_tls
def test_a_process_reaches_the_threaded_https_server_through_its_kubeconfig(tmp_path: Path) -> None:
    with KubeApiServer(tmp_path / "kube", tls=True, token_file=True) as api:
        api.add_node(NODE, max_pods=29)
        api.add_pod("web", NODE)
        api.add_pod("elsewhere", "ip-10-0-0-11")
        config = json.loads(api.kubeconfig.read_text())
        assert api.url.startswith("https://127.0.0.1:")
        assert config["clusters"][0]["cluster"]["certificate-authority"] == str(api.tls.ca_cert)  # type: ignore[union-attr]
        (node, pods) = run_client(
            api.kubeconfig,
            f"/api/v1/nodes/{NODE}",
            f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}",
        )
        assert node[0] == 200 and node[1]["status"]["capacity"]["pods"] == "29"  # type: ignore[index]
        assert [p["metadata"]["name"] for p in pods[1]["items"]] == ["web"]  # type: ignore[index]
        old = api.token
        api.rotate_token()  # the process re-reads the token file: the new token
        assert run_client(api.kubeconfig, "/api/v1/nodes")[0][0] == 200
        assert (
            [r.headers["authorization"] for r in api.requests][-1]
            == f"Bearer {api.token}"
            != f"Bearer {old}"
        )
        api.call(api.down())
        with pytest.raises(subprocess.CalledProcessError):
            run_client(api.kubeconfig, "/api/v1/nodes")
        api.call(api.up())
        api.throttle(1, retry_after_s=2)
        (throttled,) = run_client(api.kubeconfig, "/api/v1/nodes")
        assert throttled[0] == 429
    assert not api.serving


def test_the_thread_fixture_serves_a_sync_test(kube_api_thread: KubeApiServer) -> None:
    kube_api_thread.add_eniconfig("default", "subnet-0a")
    ((status, body),) = run_client(
        kube_api_thread.kubeconfig, "/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs/default"
    )
    assert status == 200 and body["spec"]["subnet"] == "subnet-0a"  # type: ignore[index]


async def test_the_tls_fixture_needs_the_ca(kube_api_tls: KubeApiServer) -> None:
    kube_api_tls.add_node(NODE)
    async with kube_api_tls.session() as client:
        assert (await client.get(f"/api/v1/nodes/{NODE}")).status == 200
    async with aiohttp.ClientSession(base_url=kube_api_tls.url) as untrusting:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await untrusting.get("/version")
