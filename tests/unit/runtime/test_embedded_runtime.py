"""The embedded node's runtime keeps its sandboxes in a record of its own: what its ADDs started (with
the addresses PodSandboxStatus reports, which a rebuild reads), kept across a new runtime on the same
file, forgotten at a DEL or when the gone file names them; a record it cannot read is refused."""

from __future__ import annotations

import json
import logging
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipamd.model import PodRef
from ipamd.runtime.cri import GrpcCriRuntime
from ipamd.runtime.embedded_cri import CriSandbox
from ipamd.runtime.embedded_runtime import (
    RECORD_VERSION,
    EmbeddedCri,
    SandboxRecordError,
    load_record,
    record_bytes,
)
from ipamd.runtime.ports import RuntimeUnavailable

CREATED = 1_700_000_000.25


def listed(rt: EmbeddedCri) -> list[CriSandbox]:
    """What the runtime lists (it is loaded: a list, never UNAVAILABLE's None)."""
    found = rt.listing()
    assert found is not None
    return found


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must fit in 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ipamd-rt-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def runtime(run_dir: Path, *, load: bool = True) -> EmbeddedCri:
    made = EmbeddedCri(
        run_dir / "cri.sock", run_dir / "cri" / "sandboxes.json", run_dir / "state" / "gone"
    )
    if load:
        made.load()
    return made


def test_a_new_runtime_has_no_record_until_an_add(run_dir: Path) -> None:
    first = runtime(run_dir)
    assert not first.kept and listed(first) == []
    assert not (run_dir / "cri").exists(), "nothing written before a change"

    first.started("pod-a", ("10.0.1.5",), CREATED, PodRef("shop", "web-0", "uid-a"))
    record = run_dir / "cri" / "sandboxes.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert stat.S_IMODE(record.parent.stat().st_mode) == 0o700

    again = runtime(run_dir)
    assert again.kept
    [sandbox] = listed(again)
    assert sandbox == CriSandbox(
        sandbox_id="pod-a",
        created_at_ns=1_700_000_000_250_000_000,
        namespace="shop",
        name="web-0",
        uid="uid-a",
        addresses=("10.0.1.5",),
    )


def test_a_second_interface_adds_its_addresses_and_a_repeated_add_changes_nothing(
    run_dir: Path,
) -> None:
    rt = runtime(run_dir)
    rt.started("pod-a", ("10.0.1.5",), CREATED, None)
    rt.started("pod-a", ("10.0.1.5",), CREATED + 9, PodRef("late", "late", "late"))
    rt.started("pod-a", ("10.0.2.7",), CREATED + 9, None)
    [sandbox] = listed(runtime(run_dir))
    assert sandbox.addresses == ("10.0.1.5", "10.0.2.7")
    assert (sandbox.namespace, sandbox.name, sandbox.uid) == ("", "", "")
    assert sandbox.created_at_ns == 1_700_000_000_250_000_000, "created at its first ADD"


def test_a_del_forgets_the_sandbox_for_good(run_dir: Path) -> None:
    rt = runtime(run_dir)
    rt.started("pod-a", ("10.0.1.5",), CREATED, None)
    rt.started("pod-b", ("10.0.1.6",), CREATED, None)
    rt.remove("pod-a")
    rt.remove("pod-a")  # a retried DEL
    assert [s.sandbox_id for s in listed(rt)] == ["pod-b"]
    assert [s.sandbox_id for s in listed(runtime(run_dir))] == ["pod-b"]


def test_the_gone_file_makes_a_pod_vanish_from_the_record(run_dir: Path) -> None:
    rt = runtime(run_dir)
    rt.started("pod-a", ("10.0.1.5",), CREATED, None)
    rt.started("pod-b", ("10.0.1.6",), CREATED, None)
    (run_dir / "state").mkdir()
    (run_dir / "state" / "gone").write_text("pod-b\n\n  \nnever-started\n")
    assert [s.sandbox_id for s in listed(rt)] == ["pod-a"]
    assert rt.status_of("pod-b") is None
    (run_dir / "state" / "gone").unlink()
    assert [s.sandbox_id for s in listed(runtime(run_dir))] == ["pod-a"], "forgotten, not hidden"


async def test_the_calls_answer_from_the_record_once_it_is_loaded(run_dir: Path) -> None:
    runtime(run_dir).started("pod-a", ("10.0.1.5", "10.0.1.9"), CREATED, PodRef("s", "web-0", "u"))
    rt = runtime(run_dir, load=False)
    async with rt, GrpcCriRuntime(rt.endpoint, timeout_s=5.0) as client:
        with pytest.raises(RuntimeUnavailable, match="starting"):
            await client.list_sandboxes()
        with pytest.raises(RuntimeUnavailable, match="starting"):
            await client.sandbox_addresses("pod-a")
        with pytest.raises(RuntimeError, match="loaded"):
            rt.started("pod-b", ("10.0.1.6",), CREATED, None)
        rt.load()
        [listed] = await client.list_sandboxes()
        assert (listed.sandbox_id, listed.state, listed.name) == ("pod-a", "ready", "web-0")
        assert await client.sandbox_addresses("pod-a") == ("10.0.1.5", "10.0.1.9")


def test_adopt_records_only_what_is_not_recorded_yet(run_dir: Path) -> None:
    rt = runtime(run_dir)
    rt.started("pod-a", ("10.0.1.5",), CREATED, None)
    rt.adopt(
        [
            CriSandbox("pod-a", 1, addresses=("10.9.9.9",)),
            CriSandbox("pod-b", 2, addresses=("10.0.1.6",)),
        ]
    )
    kept = {s.sandbox_id: s.addresses for s in listed(runtime(run_dir))}
    assert kept == {"pod-a": ("10.0.1.5",), "pod-b": ("10.0.1.6",)}


def test_a_change_that_cannot_be_saved_is_logged_and_kept_in_memory(
    run_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime(run_dir)
    (run_dir / "cri").write_text("a file where the runtime's directory goes")
    with caplog.at_level(logging.WARNING, logger="ipamd.runtime.embedded_runtime"):
        rt.started("pod-a", ("10.0.1.5",), CREATED, None)
    assert [s.sandbox_id for s in listed(rt)] == ["pod-a"]
    assert any(r.getMessage().startswith("cri.record_unsaved path=") for r in caplog.records)


@pytest.mark.parametrize(
    "contents",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[]",
        json.dumps({"version": 99, "sandboxes": []}).encode(),
        json.dumps({"version": RECORD_VERSION}).encode(),
        json.dumps({"version": RECORD_VERSION, "sandboxes": 3}).encode(),
        json.dumps({"version": RECORD_VERSION, "sandboxes": ["pod-a"]}).encode(),
        record_bytes([CriSandbox("", 1)]),
        record_bytes([CriSandbox("pod-a", 1), CriSandbox("pod-a", 2)]),
        record_bytes([CriSandbox("pod-a", 1)]).replace(
            b'"created_at_ns": 1', b'"created_at_ns": true'
        ),
        record_bytes([CriSandbox("pod-a", 1)]).replace(b'"name": ""', b'"name": 7'),
        record_bytes([CriSandbox("pod-a", 1, addresses=("10.0.1.5",))]).replace(
            b'"10.0.1.5"', b"5"
        ),
    ],
)
def test_a_record_that_cannot_be_read_is_refused_naming_the_file(
    run_dir: Path, contents: bytes
) -> None:
    record = run_dir / "sandboxes.json"
    record.write_bytes(contents)
    with pytest.raises(SandboxRecordError, match=f"record {record} is unusable: "):
        load_record(record)


def test_a_record_round_trips() -> None:
    sandboxes = [
        CriSandbox("pod-a", 5, namespace="n", name="a", uid="u", addresses=("10.0.1.5",)),
        CriSandbox("pod-b", 7, addresses=("10.0.1.6", "10.0.1.7")),
    ]
    with tempfile.TemporaryDirectory() as where:
        record = Path(where) / "sandboxes.json"
        record.write_bytes(record_bytes(sandboxes))
        assert load_record(record) == {s.sandbox_id: s for s in sandboxes}
        assert load_record(Path(where) / "missing.json") is None
