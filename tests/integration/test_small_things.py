"""What an operator meets first, each as they meet it: the versions, a subnet reading not taken yet,
a wanted address said plainly, a routine restart logged as routine, whole container IDs."""

from __future__ import annotations

import subprocess

import pytest

from ipamd.cli.ipamctl import render_status
from ipamd.version import installed
from tests.support.embedded_daemon import BIN, clean_env


@pytest.mark.parametrize("program", ["ipamd", "ipamctl"])
def test_both_programs_say_their_version(program: str) -> None:
    done = subprocess.run(
        [str(BIN / program), "--version"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{program} {installed()}"
    assert installed() != "unknown", "the package is installed"


def test_a_subnet_reading_not_taken_yet_is_said_so() -> None:
    pool = {
        "enis": [],
        "counts": dict.fromkeys(("free", "assigned", "cooling", "held", "releasing", "lost"), 0),
        "allocations": 0,
        "intents": 0,
        "quarantined": 0,
        "subnets": {"free_addresses": None, "scarce": False, "prefix_fallback": False},
    }
    text = render_status(pool)
    assert "free_addresses=not read yet" in text and "None" not in text


def test_a_pod_short_of_one_address_is_told_so_plainly() -> None:
    from datastore.records import AllocationKey
    from ipamd.engine.allocator import EngineParams, plan_assign
    from ipamd.engine.state import NodeState
    from ipamd.errors import NoAddressAvailable
    from ipamd.model import PodRef

    with pytest.raises(NoAddressAvailable) as one:
        plan_assign(NodeState(), AllocationKey("n", "c", "eth0"), PodRef(), 1, 0.0, EngineParams())
    assert str(one.value).startswith("no free address right now;"), one.value
    with pytest.raises(NoAddressAvailable) as two:
        plan_assign(NodeState(), AllocationKey("n", "c", "eth0"), PodRef(), 2, 0.0, EngineParams())
    assert str(two.value).startswith("no 2 free addresses on one ENI right now;"), two.value
