"""`ipamd-cni` as the runtime runs it: a real process, CNI_* environment and the config on stdin, against
the API served on a real unix socket by this test's event loop (the plugin runs through
`asyncio.create_subprocess_exec`, so the server keeps serving while it waits)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ipamd.api import create_app, serve_unix
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from tests.support.node import NodeFixture

PLUGIN = Path(sys.executable).parent / "ipamd-cni"
NETWORK = "k8s-pod-network"
GRACE_S = 60.0
VERSIONS = ("0.4.0", "1.0.0", "1.1.0")
K8S_ARGS = (
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;"
    "K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=7f1d2c3b"
)


@dataclass
class Run:
    code: int
    out: Any
    """stdout decoded as JSON, None when empty."""
    err: str
    elapsed_s: float


@dataclass
class Daemon:
    node: NodeFixture
    engine: Engine
    socket: Path
    ready: bool = False

    def conf(self, version: str = "1.1.0", /, **extra: object) -> dict[str, object]:
        return {
            "cniVersion": version,
            "name": NETWORK,
            "type": "ptp",
            "ipam": {"type": "ipamd-cni", "socket": str(self.socket)},
            **extra,
        }

    async def cni(
        self,
        command: str,
        conf: dict[str, object] | bytes | None = None,
        *,
        cid: str = "c1",
        ifname: str = "eth0",
        args: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Run:
        environ = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": f"/var/run/netns/cni-{cid}",
            "CNI_IFNAME": ifname,
            "CNI_ARGS": K8S_ARGS.format(cid=cid) if args is None else args,
            "CNI_PATH": "/opt/cni/bin",
            **(env or {}),
        }
        if conf is None:
            conf = self.conf()
        stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
        return await run_plugin({k: v for k, v in environ.items() if v != "<unset>"}, stdin)


async def run_plugin(environ: dict[str, str], stdin: bytes) -> Run:
    start = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        str(PLUGIN),
        env=environ,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin), timeout=30)
    elapsed = time.perf_counter() - start
    assert process.returncode is not None
    return Run(process.returncode, json.loads(out) if out.strip() else None, err.decode(), elapsed)


@pytest.fixture
def engine_params() -> EngineParams:
    """The engine's settings, final once `daemon` opens it: a test that needs others parametrizes
    this fixture."""
    return EngineParams()


@pytest.fixture
def damaged() -> bool:
    """Whether `daemon` serves on a state file that cannot be trusted (its engine refuses every
    change): a test that needs one parametrizes this fixture."""
    return False


@pytest.fixture
async def daemon(
    node: NodeFixture, engine_params: EngineParams, damaged: bool
) -> AsyncIterator[Daemon]:
    node.settings = engine_params
    if damaged:
        engine = await node.open_damaged()
    else:
        engine = await node.open()
        await node.seed(enis=1, per_eni=4)
    directory = Path(tempfile.mkdtemp(prefix="ipamd-cni-", dir="/tmp"))
    d = Daemon(node, engine, directory / "ipamd.sock")
    app = create_app(engine, ready=lambda: d.ready, gc_grace_s=GRACE_S, clock=node.clock)
    runner: web.AppRunner = await serve_unix(app, d.socket)
    try:
        yield d
    finally:
        await runner.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


def assert_cni_error(run: Run, code: int, version: str = "1.1.0") -> None:
    assert run.code != 0, run
    assert run.out["code"] == code, run.out
    assert run.out["cniVersion"] == version
    assert isinstance(run.out["msg"], str) and run.out["msg"]


# -- the lifecycle, per config version ---------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
async def test_add_check_del_in_the_configs_version(daemon: Daemon, version: str) -> None:
    conf = daemon.conf(version)
    added = await daemon.cni("ADD", conf)
    assert added.code == 0, added
    result = added.out
    assert result["cniVersion"] == version
    assert set(result) == {"cniVersion", "ips", "routes"}, "an IPAM result: no interfaces"
    [ip] = result["ips"]
    assert ip["address"].startswith("10.0.0.") and ip["address"].endswith("/32")
    assert ip["gateway"] == "169.254.1.1"
    assert ("version" in ip) is (version == "0.4.0")
    if version == "0.4.0":
        assert ip["version"] == "4"
    assert result["routes"] == [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]
    record = daemon.engine.state.allocations()[next(iter(daemon.engine.state.allocations()))]
    assert (record.key.network, record.key.container_id, record.key.ifname) == (
        NETWORK,
        "c1",
        "eth0",
    )
    assert (record.pod_namespace, record.pod_name, record.pod_uid) == (
        "default",
        "web-0",
        "7f1d2c3b",
    )

    again = await daemon.cni("ADD", conf)
    assert again.code == 0 and again.out == result, "same attachment, same address"

    checked = await daemon.cni("CHECK", {**conf, "prevResult": result})
    assert (checked.code, checked.out) == (0, None), checked

    deleted = await daemon.cni("DEL", {**conf, "prevResult": result})
    assert (deleted.code, deleted.out) == (0, None), deleted
    assert daemon.engine.state.allocations() == {}
    repeated = await daemon.cni("DEL", conf)
    assert (repeated.code, repeated.out) == (0, None)

    late = await daemon.cni("ADD", conf)
    assert_cni_error(late, 3, version)  # the container was deleted: nothing to clean up
    assert "delete_intent" in late.out["details"]
    daemon.node.check()


async def test_del_of_an_attachment_never_added_succeeds(daemon: Daemon) -> None:
    run = await daemon.cni("DEL", cid="never-added", args="garbage-is-ignored-on-DEL")
    assert (run.code, run.out) == (0, None), run


async def test_gc_releases_what_the_runtime_does_not_list(daemon: Daemon) -> None:
    for cid in ("live", "dead"):
        assert (await daemon.cni("ADD", cid=cid)).code == 0
    daemon.node.clock.advance(GRACE_S)
    valid = [{"containerID": "live", "ifname": "eth0"}]
    unset = {"CNI_CONTAINERID": "<unset>", "CNI_IFNAME": "<unset>", "CNI_NETNS": "<unset>"}
    run = await daemon.cni("GC", daemon.conf(**{"cni.dev/valid-attachments": valid}), env=unset)
    assert (run.code, run.out) == (0, None), run
    assert [k.container_id for k in daemon.engine.state.allocations()] == ["live"]
    assert "dead" in daemon.engine.state.intents()
    daemon.node.check()


async def test_gc_accepts_the_spec_drafts_key_spelling(daemon: Daemon) -> None:
    assert (await daemon.cni("ADD")).code == 0
    daemon.node.clock.advance(GRACE_S)
    run = await daemon.cni("GC", daemon.conf(**{"cni.dev/attachments": []}))
    assert (run.code, run.out) == (0, None), run
    assert daemon.engine.state.allocations() == {}


async def test_concurrent_adds_get_distinct_addresses_until_the_pool_is_empty(
    daemon: Daemon,
) -> None:
    runs = await asyncio.gather(*(daemon.cni("ADD", cid=f"pod{i}") for i in range(6)))
    addresses = [r.out["ips"][0]["address"] for r in runs if r.code == 0]
    assert len(addresses) == len(set(addresses)) == 4, "four addresses in the pool"
    assert sorted(r.out["code"] for r in runs if r.code != 0) == [11, 11]
    daemon.node.check()


async def test_gc_without_the_valid_attachments_key_releases_nothing(daemon: Daemon) -> None:
    assert (await daemon.cni("ADD")).code == 0
    daemon.node.clock.advance(GRACE_S)
    assert_cni_error(await daemon.cni("GC", daemon.conf()), 7)
    assert len(daemon.engine.state.allocations()) == 1


async def test_status_follows_readiness(daemon: Daemon) -> None:
    assert_cni_error(await daemon.cni("STATUS"), 50)
    daemon.ready = True
    ready = await daemon.cni("STATUS", env={"CNI_CONTAINERID": "<unset>", "CNI_IFNAME": "<unset>"})
    assert (ready.code, ready.out) == (0, None), ready


@pytest.mark.parametrize("command", ["GC", "STATUS"])
@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
async def test_gc_and_status_need_a_1_1_config(daemon: Daemon, command: str, version: str) -> None:
    conf = daemon.conf(version, **{"cni.dev/valid-attachments": []})
    assert_cni_error(await daemon.cni(command, conf), 1, version)


async def test_version_answers_without_reading_the_config() -> None:
    run = await run_plugin({"CNI_COMMAND": "VERSION"}, b'{"cniVersion": "0.4.0"}')
    assert run.code == 0
    assert run.out == {"cniVersion": "1.1.0", "supportedVersions": list(VERSIONS)}


# -- errors ---------------------------------------------------------------------------------------


async def test_an_empty_pool_is_try_again_later(daemon: Daemon) -> None:
    for i in range(4):
        assert (await daemon.cni("ADD", cid=f"c{i}")).code == 0
    run = await daemon.cni("ADD", cid="one-too-many")
    assert_cni_error(run, 11)
    assert "no_address" in run.out["details"]
    assert daemon.engine.pool_wanted


@pytest.mark.parametrize("engine_params", [EngineParams(max_addresses=4)])
async def test_a_node_that_can_hold_no_more_addresses_is_node_full_not_try_again(
    daemon: Daemon,
) -> None:
    for i in range(4):
        assert (await daemon.cni("ADD", cid=f"c{i}")).code == 0
    run = await daemon.cni("ADD", cid="one-too-many")
    assert_cni_error(run, 101)
    assert "node_full" in run.out["details"]


async def test_check_reports_a_missing_or_different_allocation(daemon: Daemon) -> None:
    added = await daemon.cni("ADD")
    other = {**added.out, "ips": [{"address": "10.9.9.9/32", "gateway": "169.254.1.1"}]}
    assert_cni_error(await daemon.cni("CHECK", daemon.conf(prevResult=other)), 104)
    unknown = await daemon.cni("CHECK", daemon.conf(prevResult=added.out), cid="unknown")
    assert_cni_error(unknown, 103)
    assert_cni_error(await daemon.cni("CHECK", daemon.conf()), 7)  # no prevResult


@pytest.mark.parametrize("damaged", [True])
async def test_unusable_state_fails_add_and_lets_del_through(daemon: Daemon) -> None:
    assert_cni_error(await daemon.cni("ADD", cid="c2"), 102)
    deleted = await daemon.cni("DEL")
    assert (deleted.code, deleted.out) == (0, None)
    assert "state_unavailable" in deleted.err


async def test_with_ipamd_down_del_succeeds_and_everything_else_fails_retryably(
    daemon: Daemon,
) -> None:
    conf = daemon.conf()
    conf["ipam"] = {"type": "ipamd-cni", "socket": str(daemon.socket.parent / "nobody.sock")}
    assert_cni_error(await daemon.cni("ADD", conf), 11)
    assert_cni_error(await daemon.cni("CHECK", {**conf, "prevResult": {"ips": []}}), 11)
    gc_conf = {**conf, "cni.dev/valid-attachments": []}
    assert_cni_error(await daemon.cni("GC", gc_conf), 11)
    assert_cni_error(await daemon.cni("STATUS", conf), 50)
    deleted = await daemon.cni("DEL", conf)
    assert (deleted.code, deleted.out) == (0, None), deleted
    assert "leak GC" in deleted.err


async def test_the_socket_can_come_from_ipamd_socket(daemon: Daemon) -> None:
    conf = daemon.conf()
    conf["ipam"] = {"type": "ipamd-cni"}
    run = await daemon.cni("ADD", conf, env={"IPAMD_SOCKET": str(daemon.socket)})
    assert run.code == 0, run


BAD_CONFIGS: dict[str, tuple[object, int]] = {
    "not JSON": (b"{cniVersion", 6),
    "not an object": (b"[]", 6),
    "unsupported cniVersion": ({"cniVersion": "0.3.1"}, 1),
    "cniVersion not a string": ({"cniVersion": 1}, 7),
    "no name": ({"name": None}, 7),
    "bad name": ({"name": "my network"}, 7),
    "no ipam": ({"ipam": None}, 7),
    "ipam not an object": ({"ipam": "ipamd-cni"}, 7),
    "unknown ipam field": ({"ipam": {"type": "ipamd-cni", "subnet": "10.0.0.0/8"}}, 2),
    "relative socket": ({"ipam": {"type": "ipamd-cni", "socket": "ipamd.sock"}}, 7),
    "socket not a string": ({"ipam": {"type": "ipamd-cni", "socket": 5}}, 7),
}


@pytest.mark.parametrize(("change", "code"), BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
async def test_bad_configs(daemon: Daemon, change: object, code: int) -> None:
    if isinstance(change, bytes):
        conf: dict[str, object] | bytes = change
    else:
        assert isinstance(change, dict)
        conf = {k: v for k, v in {**daemon.conf(), **change}.items() if v is not None}
    run = await daemon.cni("ADD", conf)
    assert run.code != 0 and run.out["code"] == code, run.out
    assert daemon.engine.state.allocations() == {}


BAD_ENVIRONMENTS: dict[str, dict[str, str]] = {
    "unknown command": {"CNI_COMMAND": "ATTACH"},
    "no container id": {"CNI_CONTAINERID": "<unset>"},
    "bad container id": {"CNI_CONTAINERID": "-c1"},
    "no ifname": {"CNI_IFNAME": "<unset>"},
    "ifname of 16": {"CNI_IFNAME": "e" * 16},
    "no netns on ADD": {"CNI_NETNS": "<unset>"},
    "CNI_ARGS not pairs": {"CNI_ARGS": "K8S_POD_NAME"},
    "CNI_ARGS unknown key": {"CNI_ARGS": "K8S_POD_NAME=web;COLOR=blue"},
    "CNI_ARGS key twice": {"CNI_ARGS": "K8S_POD_NAME=a;K8S_POD_NAME=b"},
    "CNI_ARGS bad IgnoreUnknown": {"CNI_ARGS": "IgnoreUnknown=maybe"},
    "CNI_ARGS pod name too long": {"CNI_ARGS": "K8S_POD_NAME=" + "p" * 254},
    "CNI_ARGS bad infra id": {"CNI_ARGS": "K8S_POD_INFRA_CONTAINER_ID=-x"},
}


@pytest.mark.parametrize("env", BAD_ENVIRONMENTS.values(), ids=BAD_ENVIRONMENTS.keys())
async def test_bad_environments_are_code_4(daemon: Daemon, env: dict[str, str]) -> None:
    command = env.pop("CNI_COMMAND", "ADD")
    run = await daemon.cni(command, env=env)
    assert_cni_error(run, 4)
    assert daemon.engine.state.allocations() == {}


async def test_unknown_cni_args_are_ignored_with_ignore_unknown(daemon: Daemon) -> None:
    run = await daemon.cni("ADD", args="IgnoreUnknown=true;COLOR=blue;K8S_POD_NAME=web")
    assert run.code == 0, run


# -- the plugin's log ------------------------------------------------------------------------------


def logged(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_each_command_leaves_its_line_in_plugin_log(daemon: Daemon, tmp_path: Path) -> None:
    path = tmp_path / "aws-routed-eni" / "plugin.log"
    conf = daemon.conf(pluginLogFile=str(path), pluginLogLevel="INFO")
    daemon.ready = True
    added = await daemon.cni("ADD", conf, cid="c1")
    assert added.code == 0, added
    assert (await daemon.cni("STATUS", conf)).code == 0
    assert (await daemon.cni("DEL", conf, cid="c1")).code == 0
    refused = await daemon.cni("ADD", conf, cid="c1")  # its delete intent
    assert_cni_error(refused, 3)
    add, delete, failed = logged(path)  # STATUS is debug: the runtime repeats it on its own
    assert list(add)[:5] == ["level", "ts", "logger", "caller", "msg"]
    assert (add["level"], add["logger"]) == ("info", "ipamd-cni")
    assert add["msg"].startswith("cni.add container_id=c1 ifname=eth0 ")
    assert (add["container_id"], add["pod"]) == ("c1", "default/web-0")
    assert add["addresses"] == [added.out["ips"][0]["address"]], "a list, as JSON"
    assert isinstance(add["elapsed_ms"], float) and add["elapsed_ms"] > 0
    assert (delete["level"], delete["msg"].split()[0]) == ("info", "cni.del")
    assert (failed["level"], failed["code"], failed["container_id"]) == ("error", 3, "c1")
    assert failed["error"] == refused.out["msg"] and "delete_intent" in failed["details"]


async def test_at_debug_the_request_and_status_are_logged_too(
    daemon: Daemon, tmp_path: Path
) -> None:
    path = tmp_path / "plugin.log"
    conf = daemon.conf(pluginLogFile=str(path), pluginLogLevel="Debug")
    daemon.ready = True
    assert (await daemon.cni("STATUS", conf)).code == 0
    assert (await daemon.cni("ADD", conf)).code == 0
    assert [(x["level"], x["msg"].split()[0]) for x in logged(path)] == [
        ("debug", "cni.request"),
        ("debug", "cni.status"),
        ("debug", "cni.request"),
        ("info", "cni.add"),
    ]


async def test_a_del_ipamd_did_not_confirm_is_a_warning_in_the_log(
    daemon: Daemon, tmp_path: Path
) -> None:
    path = tmp_path / "plugin.log"
    conf = daemon.conf(pluginLogFile=str(path), pluginLogLevel="info")
    conf["ipam"] = {"type": "ipamd-cni", "socket": str(daemon.socket.parent / "nobody.sock")}
    deleted = await daemon.cni("DEL", conf)
    assert (deleted.code, deleted.out) == (0, None)
    assert "leak GC" in deleted.err, "standard error says it as before"
    warning, done = logged(path)
    assert warning["level"] == "warn" and "reported as done" in warning["msg"]
    assert done["msg"].startswith("cni.del ")


async def test_a_log_that_cannot_be_written_changes_no_answer(
    daemon: Daemon, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    conf = daemon.conf(pluginLogFile=str(blocker / "plugin.log"), pluginLogLevel="debug")
    added = await daemon.cni("ADD", conf)
    assert added.code == 0 and added.err == "", added
    assert (await daemon.cni("DEL", conf)).code == 0
    without = await daemon.cni("ADD", daemon.conf(), cid="c2")
    assert set(added.out) == set(without.out)


# -- start-up -------------------------------------------------------------------------------------


async def test_the_plugin_imports_nothing_of_the_daemon() -> None:
    code = "import sys, ipamd.cni.plugin; print(' '.join(sorted(sys.modules)))"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, env={}
    )
    out, _ = await process.communicate()
    loaded = set(out.decode().split())
    assert "ipamd.wire" in loaded
    heavy = {"asyncio", "aiohttp", "sqlite3", "ipamd.engine", "ipamd.api", "datastore", "boto3"}
    assert not loaded & heavy, loaded & heavy


def test_plugin_is_installed_next_to_the_interpreter() -> None:
    assert PLUGIN.exists() and os.access(PLUGIN, os.X_OK)
