"""`free_port` hands out ports a listener binding port 0 can never be given: below the kernel's
ephemeral range, free when drawn, and never the same twice in one process. A port drawn from the
ephemeral range once collided with the embedded cloud's loopback server, bound to port 0 by the
daemon between the test's probe and the daemon's own bind of that port."""

from __future__ import annotations

import random
import socket

import pytest

from bench.vpc import processes
from bench.vpc.processes import free_port


def test_ports_are_below_the_ephemeral_range_and_distinct() -> None:
    low = processes._ephemeral_low()
    ports = [free_port() for _ in range(200)]
    assert all(1024 <= port < low for port in ports)
    assert len(set(ports)) == len(ports)


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        taken = held.getsockname()[1]
        draws = iter([taken, taken + 1 if taken + 1 < processes._ephemeral_low() else taken - 1])
        monkeypatch.setattr(random, "randrange", lambda _a, _b: next(draws))
        monkeypatch.setattr(processes, "_HANDED_OUT", set())
        assert free_port() != taken


def test_no_free_port_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "_HANDED_OUT", set(range(0, 65536)))
    with pytest.raises(RuntimeError, match="no free port"):
        free_port()
