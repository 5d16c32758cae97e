"""The API bench's separate processes: the floor's trivial server answers as the daemon frames its
answers, and a client process waits for its go signal, then reports each pair's marks in order."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.api_client import pairs
from ipamd.cni.client import call

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def floor(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "floor.sock")
    with subprocess.Popen(
        [sys.executable, "-m", "bench.socket_floor", path], stdout=subprocess.PIPE, cwd=ROOT
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == b"ready"
            yield path
        finally:
            proc.kill()


def test_the_floor_answers_the_plugins_client(floor: str) -> None:
    assert call(floor, "POST", "/v1/allocations", {"container_id": "c"}) == {}
    assert call(floor, "GET", "/v1/pool") == {}


def test_pairs_are_marked_in_order(floor: str) -> None:
    marks = pairs(floor, "p", 3)
    assert len(marks) == 3
    flat = [t for mark in marks for t in mark]
    assert flat == sorted(flat) and len(set(flat)) == len(flat)


def test_a_client_process_starts_only_on_go(floor: str) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "bench.api_client", floor, "x", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert len(json.loads(proc.stdout.readline())) == 2
        assert proc.poll() is None  # reported, and waits for its stdin to end before it exits
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out == b""


def test_a_client_process_told_anything_else_does_nothing(floor: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.api_client", floor, "x", "2"],
        check=False,
        input=b"stop\n",
        capture_output=True,
        cwd=ROOT,
        timeout=30,
    )
    assert proc.returncode == 1
    assert proc.stdout.strip() == b"ready"
