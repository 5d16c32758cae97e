"""ipamd's log lines and its node file (`ipamd.telemetry.logs`): VPC CNI's fields, each event's
`key=value` pairs as fields of their own JSON type, the same line on standard error as in the file,
the file rotated by size and its backups gzipped and pruned as VPC CNI's lumberjack does, a file
that cannot be opened said once, and the level VPC CNI's variable names."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipamd.cni import logfile
from ipamd.telemetry.logs import (
    JsonFormatter,
    NodeLogFile,
    configure_logging,
    event_fields,
)

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(?:Z|[+-]\d{4})")


def record(msg: object, *args: object, level: int = logging.INFO) -> logging.LogRecord:
    made = logging.LogRecord(
        "ipamd.pool.manager", level, "/x/ipamd/pool/manager.py", 42, msg, args, None
    )
    return made


def line(msg: object, *args: object, level: int = logging.INFO) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(JsonFormatter().format(record(msg, *args, level=level)))
    return loaded


@dataclasses.dataclass(frozen=True)
class Report:
    lost: list[str]
    enis_gone: tuple[str, ...]
    count: int
    hidden: str = dataclasses.field(default="x", repr=False)


def test_a_line_has_vpc_cni_fields_in_zaps_order_then_the_events_pairs() -> None:
    got = line("pool.grew eni_id=%s units=%d", "eni-0a1", 3)
    assert list(got) == ["level", "ts", "logger", "caller", "msg", "eni_id", "units"]
    assert got["level"] == "info"
    assert TS.fullmatch(str(got["ts"])), got["ts"]
    assert got["logger"] == "ipamd.pool.manager"
    assert got["caller"] == "pool/manager.py:42", "zap's short caller: directory, file, line"
    assert got["msg"] == "pool.grew eni_id=eni-0a1 units=3", "the event as it reads"
    assert (got["eni_id"], got["units"]) == ("eni-0a1", 3)


@pytest.mark.parametrize(
    ("level", "name"),
    [
        (logging.DEBUG, "debug"),
        (logging.INFO, "info"),
        (logging.WARNING, "warn"),
        (logging.ERROR, "error"),
        (logging.CRITICAL, "fatal"),
    ],
)
def test_levels_are_named_as_zap_names_them(level: int, name: str) -> None:
    assert line("x.y", level=level)["level"] == name


def test_values_keep_their_json_types() -> None:
    got = line(
        "reconcile.drift count=%d free=%s lost=%s ratio=%.2f retryable=%s none=%s tags=%s "
        "gone=%s mode=%o reason=%r report=%s",
        7,
        12,
        ["10.0.1.23/32", "10.0.1.24/32"],
        2 / 3,
        True,
        None,
        {"team": "a"},
        frozenset({"eni-b", "eni-a"}),
        0o660,
        "subnet full",
        Report(["10.0.1.23/32"], ("eni-1",), 2),
    )
    assert got["count"] == 7 and got["free"] == 12
    assert got["lost"] == ["10.0.1.23/32", "10.0.1.24/32"], "a list stays a list"
    assert got["ratio"] == 0.67, "rounded as %.2f shows it"
    assert got["retryable"] is True and got["none"] is None
    assert got["tags"] == {"team": "a"}
    assert got["gone"] == ["eni-a", "eni-b"], "a set as a sorted list"
    assert got["mode"] == "660", "octal stays the text it reads as"
    assert got["reason"] == "subnet full", "%r of a string: the string, not its repr"
    assert got["report"] == {"lost": ["10.0.1.23/32"], "enis_gone": ["eni-1"], "count": 2}
    assert "lost=['10.0.1.23/32', '10.0.1.24/32']" in str(got["msg"]), "msg reads as rendered"


def test_values_with_spaces_and_equals_signs_are_whole() -> None:
    got = line("pool.failed error=%s demand=%d", "InvalidParameter: a=b c=d", 2)
    assert got["error"] == "InvalidParameter: a=b c=d"
    assert got["demand"] == 2
    assert "a" not in got and "c" not in got, "pairs come from the format, not the rendered text"


def test_only_a_key_right_before_a_placeholder_is_a_field() -> None:
    got = line(
        "hostnet.off reason=IPAMD_HOST_NETWORK=off: pods lack %s; %s=%s to=new ENI in %s",
        "egress",
        "NAME",
        "value",
        "subnet-1",
    )
    assert set(got) == {"level", "ts", "logger", "caller", "msg"}
    assert got["msg"] == (
        "hostnet.off reason=IPAMD_HOST_NETWORK=off: pods lack egress; NAME=value to=new ENI in "
        "subnet-1"
    )
    assert line("pool.subnet_full error=%s: new ENIs go elsewhere", "boom")["error"] == "boom"
    assert line("a.b x=%d%% done", 50)["x"] == 50, "%% takes no argument"


def test_a_field_named_like_a_line_key_or_twice_is_kept_under_another_name() -> None:
    got = line("a.b msg=%s level=%s n=%d n=%d", "m", "l", 1, 2)
    assert got["msg"] == "a.b msg=m level=l n=1 n=2"
    assert (got["msg_"], got["level_"], got["level"]) == ("m", "l", "info")
    assert (got["n"], got["n_"]) == (1, 2)


def test_strings_are_escaped_and_each_line_is_one_line() -> None:
    text = JsonFormatter().format(record("cni.x path=%s note=%s", 'a"b\\c', "two\nlines\u00e9"))
    assert "\n" not in text
    got = json.loads(text)
    assert (got["path"], got["note"]) == ('a"b\\c', "two\nlines\u00e9")


def test_formats_and_arguments_that_do_not_pair_give_no_fields() -> None:
    assert event_fields(record("a.b x=%s y=%s", "only one")) == {}
    assert event_fields(record("a.b x=%*d", 3, 4)) == {}
    assert event_fields(record(ValueError("not a format"))) == {}
    assert event_fields(record("a.b x=%(x)s", {"x": [1]})) == {"x": [1]}


def test_an_exception_goes_under_stacktrace_last() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        made = record("job.failed job=%s", "leak_gc", level=logging.ERROR)
        made.exc_info = sys.exc_info()
    got = json.loads(JsonFormatter().format(made))
    assert list(got)[-1] == "stacktrace" and "RuntimeError: boom" in str(got["stacktrace"])
    assert got["job"] == "leak_gc"


def test_timestamps_are_zaps_iso8601_with_the_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    try:
        monkeypatch.setenv("TZ", "UTC")
        time.tzset()
        assert logfile.timestamp(1714564800.5) == "2024-05-01T12:00:00.500Z"
        monkeypatch.setenv("TZ", "IST-5:30")
        time.tzset()
        assert logfile.timestamp(1714564800.5) == "2024-05-01T17:30:00.500+0530"
        monkeypatch.setenv("TZ", "EST+5")
        time.tzset()
        assert logfile.timestamp(1714564800.001) == "2024-05-01T07:00:00.001-0500"
    finally:
        monkeypatch.undo()
        time.tzset()


# -- the file -------------------------------------------------------------------------------------


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def test_the_file_holds_the_same_lines_as_standard_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restored_logging: None
) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    path = tmp_path / "aws-routed-eni" / "ipamd.log"
    configure_logging("json", "info", str(path))
    logger = logging.getLogger("ipamd.test")
    logger.info("daemon.ready instance_id=%s", "i-0123")
    logger.debug("not.shown")
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o755
    assert path.read_text() == stderr.getvalue()
    (only,) = path.read_text().splitlines()
    assert json.loads(only)["instance_id"] == "i-0123"


def test_text_on_a_terminal_json_in_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restored_logging: None
) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    path = tmp_path / "ipamd.log"
    configure_logging("text", "info", str(path))
    logging.getLogger("ipamd.test").info("daemon.ready instance_id=%s", "i-0123")
    assert "INFO ipamd.test daemon.ready instance_id=i-0123" in stderr.getvalue()
    assert json.loads(path.read_text())["msg"] == "daemon.ready instance_id=i-0123"


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        ("debug", ["debug", "info", "warn"]),
        ("INFO", ["info", "warn"]),
        ("Warn", ["warn"]),
        ("error", []),
    ],
)
def test_the_level_is_vpc_cnis_name(
    tmp_path: Path, restored_logging: None, level: str, shown: list[str]
) -> None:
    path = tmp_path / "ipamd.log"
    configure_logging("json", level, str(path))
    logger = logging.getLogger("ipamd.test")
    logger.debug("a.debug")
    logger.info("a.info")
    logger.warning("a.warn")
    assert [json.loads(x)["level"] for x in path.read_text().splitlines()] == shown


def test_at_debug_the_aws_sdk_stays_at_info(tmp_path: Path, restored_logging: None) -> None:
    path = tmp_path / "ipamd.log"
    configure_logging("json", "debug", str(path))
    logging.getLogger("botocore.endpoint").debug("Sending http request: <signed headers>")
    logging.getLogger("botocore.credentials").info("Found credentials")
    logging.getLogger("ipamd.cloud").debug("imds.token ttl_s=%d", 21600)
    assert [json.loads(x)["msg"] for x in path.read_text().splitlines()] == [
        "Found credentials",
        "imds.token ttl_s=21600",
    ]


def test_no_file_when_none_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restored_logging: None
) -> None:
    monkeypatch.chdir(tmp_path)
    configure_logging("json", "info", None)
    logging.getLogger("ipamd.test").info("a.b")
    assert [type(h) for h in logging.getLogger().handlers] == [logging.StreamHandler]
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_be_opened_is_said_once_and_logging_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restored_logging: None
) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    configure_logging("json", "info", str(blocker / "ipamd.log"))
    logging.getLogger("ipamd.test").info("daemon.ready")
    first, second = (json.loads(x) for x in stderr.getvalue().splitlines())
    assert first["level"] == "warn" and first["msg"].startswith("log.file_unavailable path=")
    assert first["path"] == str(blocker / "ipamd.log") and first["error"] == "Not a directory"
    assert second["msg"] == "daemon.ready"


def test_a_write_that_fails_is_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restored_logging: None
) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    configure_logging("json", "info", str(tmp_path / "ipamd.log"))
    (handler,) = [h for h in logging.getLogger().handlers if isinstance(h, NodeLogFile)]
    os.close(handler._fd)
    handler._fd = os.open(os.devnull, os.O_RDONLY)  # every write fails
    for n in range(3):
        logging.getLogger("ipamd.test").info("a.b n=%d", n)
    said = [json.loads(x) for x in stderr.getvalue().splitlines()]
    assert [x["msg"] for x in said if x["msg"].startswith("log.")] == [
        f"log.file_failed path={handler.path} error=[Errno 9] Bad file descriptor: ipamd logs "
        "to its standard error only until writing works again"
    ]
    assert [x["n"] for x in said if "n" in x] == [0, 1, 2], "standard error has every line"


def test_the_file_rotates_by_size_and_keeps_five_gzipped_backups(tmp_path: Path) -> None:
    path = tmp_path / "ipamd.log"
    handler = NodeLogFile(str(path), max_size=2000)
    handler.setFormatter(JsonFormatter())
    written: list[str] = []
    for n in range(200):
        made = record("pool.tick n=%d pad=%s", n, "x" * 60)
        handler.handle(made)
        written.append(JsonFormatter().format(made))
        handler.milling.join(timeout=30)
    handler.close()
    backups = sorted(p.name for p in tmp_path.iterdir() if p.name != "ipamd.log")
    assert len(backups) == logfile.MAX_BACKUPS, backups
    assert all(
        re.fullmatch(r"ipamd-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{3}\.log\.gz", b) for b in backups
    )
    assert path.stat().st_size <= 2000
    kept = [
        x
        for b in backups
        for x in gzip.decompress((tmp_path / b).read_bytes()).decode().splitlines()
    ]
    kept += path.read_text().splitlines()
    ns = [json.loads(x)["n"] for x in kept]
    assert ns == list(range(ns[0], 200)), "the newest lines, in order, none torn or lost"
    assert all(len(b) <= 2000 for b in kept)


def test_a_file_removed_or_truncated_by_hand_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "ipamd.log"
    handler = NodeLogFile(str(path), max_size=1000)
    handler.setFormatter(JsonFormatter())
    for n in range(4):
        handler.handle(record("pool.tick n=%d", n))
    os.truncate(path, 0)  # as `> ipamd.log` does
    for n in range(4, 8):
        handler.handle(record("pool.tick n=%d", n))
    assert [p.name for p in tmp_path.iterdir()] == ["ipamd.log"], "no rotation of a small file"
    path.unlink()  # lines go to the removed file until it is full, then a new one starts
    for n in range(8, 40):
        handler.handle(record("pool.tick n=%d", n))
    handler.milling.join(timeout=30)
    handler.close()
    assert path.exists() and json.loads(path.read_text().splitlines()[-1])["n"] == 39
    backups = [p for p in tmp_path.iterdir() if p.name != "ipamd.log"]
    assert backups and all(p.name.endswith(".log.gz") for p in backups)
    kept = [
        json.loads(x)["n"] for p in backups for x in gzip.decompress(p.read_bytes()).splitlines()
    ]
    assert min(kept) > 8, "the removed file's lines were not backed up: it was gone"


@pytest.mark.parametrize(
    "name",
    [
        "ipamd-2024-05-01T12-00-00.log",
        "ipamd-2024-13-01T12-00-00.000.log",
        "ipamd-2024-05-01 12-00-00.000.log",
        "ipamd-yesterday.log",
        "ipamd-2024-05-01T12-00-00.000.log.zip",
    ],
)
def test_names_that_are_no_backup_are_left_alone(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("keep\n")
    logfile.mill(str(tmp_path / "ipamd.log"))
    assert [p.name for p in tmp_path.iterdir()] == [name]
