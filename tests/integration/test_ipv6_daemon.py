"""`ipamd run --embedded` in IPv6 mode, as a process: it keeps one /80 on the primary ENI, hands out
/128s from it, and a restart reads the /80 back from EC2 instead of asking for another."""

from __future__ import annotations

import ipaddress
import json
import time
from pathlib import Path

from tests.support.embedded_daemon import EmbeddedDaemon, start_daemon

TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "cni" / "10-ipamd.conflist"

IPV6_MODE = {"ENABLE_IPv4": "false", "ENABLE_IPv6": "true", "ENABLE_PREFIX_DELEGATION": "true"}


def _written(path: Path, deadline_s: float = 30.0) -> str:
    """The conflist, once the daemon wrote it (it does so right after it is ready)."""
    end = time.monotonic() + deadline_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} was not written"
        time.sleep(0.05)
    return path.read_text()


def _v6_units(daemon: EmbeddedDaemon) -> list[tuple[str, bool]]:
    """(prefix, on the primary ENI) for every /80 `/v1/enis` shows."""
    status, body = daemon.call("GET", "/v1/enis")
    assert status == 200, body
    return [
        (str(unit["cidr"]), bool(eni["is_primary"]))
        for eni in body["enis"]
        for unit in eni.get("units", [])
        if ":" in str(unit["cidr"])
    ]


def test_an_ipv6_node_serves_128s_from_one_80_on_the_primary_eni_and_keeps_it_across_a_restart(
    tmp_path: Path, started: list[EmbeddedDaemon]
) -> None:
    conf_dir = tmp_path / "net.d"
    daemon = start_daemon(
        tmp_path,
        IPAMD_CNI_CONF_DIR=str(conf_dir),
        IPAMD_CNI_CONFLIST_TEMPLATE=str(TEMPLATE),
        **IPV6_MODE,
    )
    started.append(daemon)
    daemon.wait_for("/readyz")
    conf = json.loads(_written(conf_dir / TEMPLATE.name))

    units = _v6_units(daemon)
    first = daemon.add("c1")
    second = daemon.add("c2")
    again = daemon.add("c1")

    assert len(units) == 1 and units[0][1], units
    prefix = ipaddress.IPv6Network(units[0][0])
    assert prefix.prefixlen == 80
    for address in (first, second):
        interface = ipaddress.IPv6Interface(address)
        assert interface.network.prefixlen == 128 and interface.ip in prefix, address
    assert first != second
    assert conf["plugins"][0]["v4Egress"] == {
        "ifname": "v4if0",
        "subnet": "169.254.172.0/22",
        "dataDir": str(daemon.socket_path.parent / "v4-egress"),
    }, "each pod also gets IPv4 egress, its addresses kept by host-local beside the socket"
    assert again == first, "a retried ADD gets the same address"
    status, body = daemon.call("GET", "/v1/allocations/c1/eth0?network=k8s-pod-network")
    assert status == 200, body
    assert body["routes"] == [{"dst": "::/0", "gw": "fe80::1"}]
    assert body["ips"][0]["gateway"] == "fe80::1"
    assert daemon.stop() == 0

    restarted = start_daemon(tmp_path, **IPV6_MODE)
    started.append(restarted)
    restarted.wait_for("/readyz")

    assert _v6_units(restarted) == units, "the /80 EC2 lists is read back, no second one assigned"
    assert restarted.add("c2") == second
    assert restarted.stop() == 0
