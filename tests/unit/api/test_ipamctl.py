"""`ipamctl` as an operator runs it (a real process) against the API served on a real socket: what it
shows, what it says when the state file is unusable or the daemon is down, and a closed pipe."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from tests.support.node import key
from tests.unit.api.conftest import Api

IPAMCTL = Path(sys.executable).parent / "ipamctl"


async def _ipamctl(*args: str, shell_tail: str = "") -> tuple[int, str, str]:
    if shell_tail:
        command = " ".join([str(IPAMCTL), *args]) + " " + shell_tail
        process = await asyncio.create_subprocess_shell(
            command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    else:
        process = await asyncio.create_subprocess_exec(
            str(IPAMCTL), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_allocations_show_their_address_and_times_in_utc(api: Api) -> None:
    await api.node.seed(enis=1, per_eni=4)
    pod = {"namespace": "shop", "name": "web-0", "uid": "u1"}
    added = await api.add("c1", pod=pod)
    code, out, err = await _ipamctl("--socket", str(api.socket_path), "allocations")
    assert code == 0, err
    header, row = out.splitlines()[:2]
    assert "ADDRESSES" in header and "CREATED_AT" in header and "POD" in header
    assert added.body["ips"][0]["address"] in row
    assert "shop/web-0" in row
    assert re.search(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\b", row), row
    assert not re.search(r"\b\d{9,}\.\d+\b", out), "no raw Unix-time floats"


@pytest.mark.parametrize("damaged", [True])
async def test_status_of_an_unusable_state_file_says_so_and_fails(api: Api) -> None:
    code, out, err = await _ipamctl("--socket", str(api.socket_path), "status")
    assert code == 1
    assert "unusable" in err and "ipamctl repair" in err
    assert "ENI" not in out, "no empty pool table"
    code, out, _ = await _ipamctl("--socket", str(api.socket_path), "--json", "status")
    assert code == 1 and "unusable" in json.loads(out)["state_unavailable"]


async def test_json_errors_are_json(tmp_path: Path) -> None:
    code, out, err = await _ipamctl("--socket", str(tmp_path / "none.sock"), "--json", "repair")
    assert code == 2
    error = json.loads(out)["error"]
    assert error["code"] == "unreachable" and "is ipamd running?" in error["message"]
    assert err == ""


async def test_a_reader_that_goes_away_ends_it_quietly(api: Api) -> None:
    await api.node.seed(enis=4, per_eni=16, kind="prefix")  # 1,024 addresses
    for n in range(1000):  # well past a pipe's 64 KiB buffer
        await api.engine.assign(key(f"pipe-{n}"))
    code, out, err = await _ipamctl(
        "--socket", str(api.socket_path), "allocations", shell_tail="| head -n 1"
    )
    assert code == 0 and out.startswith("NETWORK"), (code, out, err)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
