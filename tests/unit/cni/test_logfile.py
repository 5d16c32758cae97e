"""The plugin's log (`ipamd.cni.logfile`): whole lines appended by processes running at once, never
torn or lost; the full file rotated by one of them only, under lumberjack's names; the backups
gzipped and pruned to VPC CNI's five and 30 days; a file that cannot be written skipped in silence;
and what the conf's `pluginLogFile` and `pluginLogLevel` say."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ipamd.cni import logfile
from ipamd.cni.invocation import CniError, parse_conf
from ipamd.cni.logfile import PluginLog, Tee

BACKUP = re.compile(r"plugin-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{3}\.log(\.gz)?")
REPO = Path(__file__).resolve().parents[3]


def lines_of(directory: Path) -> list[dict[str, object]]:
    """Every line of the log and its backups, oldest backup first."""
    found: list[dict[str, object]] = []
    for path in sorted(directory.iterdir()):
        if path.name.endswith(".gz"):
            text = gzip.decompress(path.read_bytes()).decode()
        elif path.name == "plugin.log" or BACKUP.fullmatch(path.name):
            text = path.read_text()
        else:
            continue
        found += [json.loads(x) for x in text.splitlines()]
    return found


def wait_milled(directory: Path, deadline_s: float = 30.0) -> list[str]:
    """The backups once no detached mill is left at work (every backup gzipped, no temp file)."""
    end = time.monotonic() + deadline_s
    while True:
        names = sorted(p.name for p in directory.iterdir() if p.name != "plugin.log")
        if all(n.endswith(".gz") for n in names):
            return names
        assert time.monotonic() < end, names
        time.sleep(0.1)


def test_a_line_appends_in_one_write_to_a_file_made_as_lumberjack_makes_it(tmp_path: Path) -> None:
    path = tmp_path / "aws-routed-eni" / "plugin.log"
    assert logfile.append(str(path), b'{"a":1}\n') is None
    assert logfile.append(str(path), b'{"a":2}\n') is None
    assert path.read_bytes() == b'{"a":1}\n{"a":2}\n'
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o755


def test_a_file_that_cannot_be_opened_is_skipped_in_silence(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert logfile.append(str(blocker / "plugin.log"), b"x\n") is None
    PluginLog(str(blocker / "plugin.log"), "debug").event("error", "cni.add_failed", code=11)
    assert blocker.read_text() == ""


def test_the_full_file_is_renamed_under_lumberjacks_name(tmp_path: Path) -> None:
    path = tmp_path / "plugin.log"
    assert logfile.append(str(path), b"a" * 99 + b"\n", max_size=200) is None
    backup = logfile.append(str(path), b"b" * 99 + b"\n", max_size=200)
    assert backup is not None and BACKUP.fullmatch(Path(backup).name), backup
    assert Path(backup).read_bytes() == b"a" * 99 + b"\n" + b"b" * 99 + b"\n"
    assert not path.exists(), "the next line starts a new file"
    logfile.append(str(path), b"c\n", max_size=200)
    assert path.read_bytes() == b"c\n"


def test_rotations_within_a_millisecond_keep_apart(tmp_path: Path) -> None:
    path = str(tmp_path / "plugin.log")
    taken = logfile.backup_name(path, 1714564800.0)
    Path(taken + ".gz").write_bytes(b"")
    assert logfile.free_backup_name(path, 1714564800.0) == logfile.backup_name(path, 1714564800.001)
    assert Path(taken).name == "plugin-2024-05-01T12-00-00.000.log", "UTC, as lumberjack names"


_WRITER = """
import sys
from ipamd.cni.logfile import PluginLog
log = PluginLog(sys.argv[1], "info", max_size=int(sys.argv[2]))
for n in range(int(sys.argv[3])):
    log.event("info", "cni.add", proc=int(sys.argv[4]), n=n, pad="p" * 40)
"""


def test_processes_at_once_never_tear_or_lose_a_line_and_rotate_once_each_time(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plugin.log"
    procs, each = 4, 30  # about 230 bytes a line: 28 kB, so three rotations of 8 kB
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), "8000", str(each), str(p)],
            cwd=REPO,
        )
        for p in range(procs)
    ]
    assert [w.wait(timeout=60) for w in writers] == [0] * procs
    backups = wait_milled(tmp_path)
    assert 2 <= len(backups) <= logfile.MAX_BACKUPS, backups
    assert all(BACKUP.fullmatch(b) for b in backups), backups
    got = lines_of(tmp_path)
    assert sorted((x["proc"], x["n"]) for x in got) == [
        (p, n) for p in range(procs) for n in range(each)
    ], "every line once: none torn, none lost, none twice"
    for p in range(procs):
        assert [x["n"] for x in got if x["proc"] == p] == list(range(each)), "in order"
    sizes = [len(gzip.decompress((tmp_path / b).read_bytes())) for b in backups]
    assert all(8000 <= s < 8000 + procs * 200 for s in sizes), sizes


def _backup(directory: Path, seconds: float, gz: bool = True, text: bytes = b"x\n") -> Path:
    path = Path(logfile.backup_name(str(directory / "plugin.log"), seconds))
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)
    return path


def test_mill_keeps_the_five_newest_none_older_than_30_days_all_gzipped(tmp_path: Path) -> None:
    now = 1714564800.0
    day = 86400.0
    newest = [
        _backup(tmp_path, now - n * 60, gz=n % 2 == 0, text=f"{n}\n".encode()) for n in range(7)
    ]
    old = _backup(tmp_path, now - 31 * day)
    twice = _backup(tmp_path, now - 10, gz=False)  # compressed before, plain copy left behind
    Path(str(twice) + ".gz").write_bytes(gzip.compress(b"x\n"))
    stale = tmp_path / (newest[0].name + ".123.tmp")
    stale.write_bytes(b"half")
    os.utime(stale, (now - 3600, now - 3600))
    fresh = tmp_path / (newest[1].name + ".gz.456.tmp")
    fresh.write_bytes(b"at work")
    os.utime(fresh, (now, now))
    unrelated = [tmp_path / "plugin.log", tmp_path / "ipamd-2024-05-01T12-00-00.000.log"]
    for path in unrelated:
        path.write_text("keep\n")
    logfile.mill(str(tmp_path / "plugin.log"), now=now)
    left = sorted(p.name for p in tmp_path.iterdir())
    kept = [Path(str(p).removesuffix(".gz") + ".gz").name for p in (twice, *newest[:4])]
    assert left == sorted([*kept, fresh.name, *(p.name for p in unrelated)]), left
    assert not old.exists() and not stale.exists()
    for n, path in enumerate(newest[:4]):
        packed = tmp_path / (path.name.removesuffix(".gz") + ".gz")
        assert gzip.decompress(packed.read_bytes()) == f"{n}\n".encode()


def test_mill_of_a_directory_that_is_gone_does_nothing(tmp_path: Path) -> None:
    logfile.mill(str(tmp_path / "gone" / "plugin.log"))


# -- the plugin's log ---------------------------------------------------------------------------


def test_a_line_has_the_daemons_fields_and_its_pairs(tmp_path: Path) -> None:
    path = tmp_path / "plugin.log"
    PluginLog(str(path), "Info").event(
        "info", "cni.add", container_id="c1", addresses=["10.0.0.5/32"], elapsed_ms=2.5
    )
    (line,) = path.read_text().splitlines()
    got = json.loads(line)
    assert list(got) == [
        "level",
        "ts",
        "logger",
        "caller",
        "msg",
        "container_id",
        "addresses",
        "elapsed_ms",
    ]
    assert (got["level"], got["logger"]) == ("info", "ipamd-cni")
    assert re.fullmatch(r"cni/test_logfile\.py:\d+", str(got["caller"])), got["caller"]
    assert got["msg"] == "cni.add container_id=c1 addresses=['10.0.0.5/32'] elapsed_ms=2.5"
    assert (got["addresses"], got["elapsed_ms"]) == (["10.0.0.5/32"], 2.5)


@pytest.mark.parametrize(
    ("level", "written"),
    [
        ("debug", ["debug", "info", "error"]),
        ("INFO", ["info", "error"]),
        ("error", ["error"]),
        ("fatal", []),
        ("chatty", ["debug", "info", "error"]),  # VPC CNI takes an unknown level for debug
        ("", ["debug", "info", "error"]),
    ],
)
def test_the_level_is_pluginloglevel(tmp_path: Path, level: str, written: list[str]) -> None:
    path = tmp_path / "plugin.log"
    log = PluginLog(str(path), level)
    for name in ("debug", "info", "error"):
        log.event(name, "cni.x")
    got = [json.loads(x)["level"] for x in path.read_text().splitlines()] if path.exists() else []
    assert got == written


def test_no_file_no_log_and_stderr_is_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert not PluginLog().enabled("fatal")
    PluginLog("", "debug").event("error", "cni.x")
    assert list(tmp_path.iterdir()) == []
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    PluginLog("stderr", "info").event("info", "cni.del", container_id="c1")
    assert json.loads(stderr.getvalue())["container_id"] == "c1"
    assert list(tmp_path.iterdir()) == []


def test_what_the_commands_print_to_stderr_is_passed_on_and_logged(tmp_path: Path) -> None:
    path = tmp_path / "plugin.log"
    stderr = io.StringIO()
    tee = Tee(stderr, PluginLog(str(path), "info"))
    print("ipamd-cni: DEL c1/eth0: refused; reported as done", file=tee)
    print("partial", end="", file=tee)
    assert stderr.getvalue() == "ipamd-cni: DEL c1/eth0: refused; reported as done\npartial"
    (line,) = path.read_text().splitlines()
    got = json.loads(line)
    assert (got["level"], got["msg"]) == ("warn", "DEL c1/eth0: refused; reported as done")
    assert str(got["caller"]).startswith("cni/test_logfile.py:")


def _conf(**fields: object) -> bytes:
    base = {"cniVersion": "1.0.0", "name": "aws-cni", "type": "ptp", "ipam": {"type": "ipamd-cni"}}
    return json.dumps({**base, **fields}).encode()


def test_the_conf_names_the_log_in_vpc_cnis_keys() -> None:
    parsed = parse_conf(
        "ADD", _conf(pluginLogFile="/var/log/aws-routed-eni/plugin.log", pluginLogLevel="Debug"), {}
    )
    assert parsed.log == ("/var/log/aws-routed-eni/plugin.log", "Debug")
    assert parse_conf("ADD", _conf(), {}).log == ("", ""), "no key: no log"
    assert parse_conf("ADD", _conf(pluginLogFile=7, pluginLogLevel=None), {}).log == ("", ""), (
        "a value of the wrong type is no log, never a failed command"
    )


def test_a_refused_conf_still_names_its_log() -> None:
    with pytest.raises(CniError) as refused:
        parse_conf("ADD", _conf(cniVersion="9.9.9", pluginLogFile="/l/plugin.log"), {})
    assert refused.value.log == ("/l/plugin.log", "")
    with pytest.raises(CniError) as bad:
        parse_conf("ADD", _conf(name="bad name!", pluginLogFile="/l/p.log", pluginLogLevel="x"), {})
    assert bad.value.log == ("/l/p.log", "x")
