"""The node's log files where aws-node keeps them: `/var/log/aws-routed-eni/ipamd.log` (the daemon's,
through `ipamd.telemetry.logs`) and `/var/log/aws-routed-eni/plugin.log` (ipamd-cni's), one JSON
object a line with the fields of VPC CNI's lines, rotated by size as VPC CNI's logger rotates them.

A line: `{"level":"info","ts":"2024-05-01T12:00:00.123Z","logger":"ipamd.pool.manager",
"caller":"pool/manager.py:210","msg":"pool.grew eni_id=eni-0a1 units=3","eni_id":"eni-0a1",
"units":3}`: zap's production keys in zap's order (`level` in lower case, `warn` and `fatal` as zap
names them; `ts` in zap's ISO 8601 form, milliseconds and the zone, `Z` for UTC; `caller` the
file's directory, name and line), `msg` the whole event as it reads, then each of the event's
`key=value` pairs as a field of its own with its JSON type, and `stacktrace` last when there is one.

Rotation is VPC CNI's (aws/amazon-vpc-cni-k8s v1.23.1, `pkg/utils/logger/zaplogger.go`, lumberjack
with MaxSize 100, MaxBackups 5, MaxAge 30, Compress true): a file that reaches 100 MB is renamed
`<name>-<UTC time>.log` (lumberjack's names, `plugin-2024-05-01T12-00-00.000.log`), a new one is
started, and then, away from the writer, backups are gzipped and only the five newest, none older
than 30 days, are kept. aws-node after a rollback reads and prunes the same names.

The plugin appends: every line is one `write()` on a file opened with `O_APPEND`, so the lines of
plugin processes running at once never interleave; the one that finds the file full renames it
under an `flock` of the file, after checking that the path still names the file it wrote (another
process may have renamed it first), and compresses in a detached child, so that no pod's ADD waits
for gzip. A file that cannot be opened or written is skipped without a word: the plugin's answer
never depends on its log.

Imported on every pod's ADD and DEL: only `io`, `os` and `sys`, which the interpreter has loaded
already, and the built-in `time` at start (`fcntl` when rotating, `gzip`, `shutil` and `calendar`
only in the compressing child).
"""

from __future__ import annotations

import io
import os
import sys
import time

from ipamd.wire import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import FrameType
    from typing import IO

MAX_SIZE = 100 * 1024 * 1024
"""lumberjack's MaxSize 100 (megabytes of 2^20 bytes)."""
MAX_BACKUPS = 5
MAX_AGE_S = 30 * 24 * 3600
"""lumberjack's MaxAge 30 (days)."""
FILE_MODE = 0o600
"""lumberjack's mode for a new log file; the directory is made 0755, as lumberjack makes it."""

LEVELS = {"debug": 10, "info": 20, "warn": 30, "error": 40, "fatal": 50}
"""VPC CNI's level names (`AWS_VPC_K8S_CNI_LOGLEVEL`, `AWS_VPC_K8S_PLUGIN_LOG_LEVEL`), lower case,
with `logging`'s numbers."""
RESERVED = ("level", "ts", "logger", "caller", "msg", "stacktrace")
"""The line's own keys: an event's field of the same name gets a `_` appended."""
STDERR = "stderr"
"""`pluginLogFile` (and `AWS_VPC_K8S_PLUGIN_LOG_FILE`) naming the plugin's standard error."""

_BACKUP_TIME = "%Y-%m-%dT%H-%M-%S"
"""lumberjack's backup time, Go's `2006-01-02T15-04-05.000`, in UTC."""
_STALE_TEMP_S = 600.0


def level_number(name: str) -> int:
    """A level name as VPC CNI reads it: any case; an unknown name is debug, as VPC CNI takes it."""
    return LEVELS.get(name.lower(), LEVELS["debug"])


def timestamp(seconds: float) -> str:
    """`seconds` (since the epoch) as zap's ISO8601TimeEncoder writes it, in local time:
    `2006-01-02T15:04:05.000Z0700`, `Z` for UTC."""
    local = time.localtime(seconds)
    offset = (local.tm_gmtoff or 0) // 60
    if offset == 0:
        zone = "Z"
    else:
        sign = "-" if offset < 0 else "+"
        zone = f"{sign}{abs(offset) // 60:02d}{abs(offset) % 60:02d}"
    millis = int(seconds * 1000) % 1000
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', local)}.{millis:03d}{zone}"


def short_caller(path: str, line: int) -> str:
    """zap's ShortCallerEncoder: the file's directory and name, and the line."""
    parent, _, name = path.rpartition("/")
    directory = parent.rpartition("/")[2]
    return f"{directory}/{name}:{line}" if directory else f"{name}:{line}"


def entry(
    level: str,
    ts: str,
    logger: str,
    caller: str,
    msg: str,
    fields: Mapping[str, object] | None = None,
    stacktrace: str | None = None,
) -> dict[str, object]:
    """One line's object, its keys in zap's order, the event's fields after `msg`."""
    line: dict[str, object] = {
        "level": level,
        "ts": ts,
        "logger": logger,
        "caller": caller,
        "msg": msg,
    }
    for name, value in (fields or {}).items():
        key = name
        while key in line or key in RESERVED:
            key += "_"
        line[key] = value
    if stacktrace:
        line["stacktrace"] = stacktrace
    return line


# -- the file ------------------------------------------------------------------------------------


def open_append(path: str) -> int:
    """The log file, for appending (created 0600, its directory 0755 if missing). Raises OSError."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    try:
        return os.open(path, flags, FILE_MODE)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", 0o755, exist_ok=True)
        return os.open(path, flags, FILE_MODE)


def append(path: str, data: bytes, max_size: int = MAX_SIZE) -> str | None:
    """Appends `data` (whole lines) to `path` in one write; rotates the file once it has reached
    `max_size` and returns the backup's path then (its compression is the caller's: `mill`).
    Never raises: a file that cannot be opened or written is skipped."""
    try:
        fd = open_append(path)
    except (OSError, ValueError):
        return None
    try:
        os.write(fd, data)
        if os.fstat(fd).st_size < max_size:
            return None
        return _rotate_full(path, fd, max_size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _rotate_full(path: str, fd: int, max_size: int) -> str | None:
    """Renames the full file `fd` is open on, unless another process already did."""
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        mine = os.fstat(fd)
        try:
            named = os.stat(path)
        except FileNotFoundError:
            return None
        if (named.st_dev, named.st_ino) != (mine.st_dev, mine.st_ino) or mine.st_size < max_size:
            return None  # rotated by another process since this one opened it
        backup = free_backup_name(path, time.time())
        os.rename(path, backup)
        return backup
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def backup_name(path: str, seconds: float) -> str:
    """lumberjack's name for the backup of `path` made at `seconds`: `<dir>/<stem>-<UTC time><ext>`."""
    directory, name = os.path.split(path)
    stem, ext = os.path.splitext(name)
    millis = int(seconds * 1000) % 1000
    stamp = f"{time.strftime(_BACKUP_TIME, time.gmtime(seconds))}.{millis:03d}"
    return os.path.join(directory, f"{stem}-{stamp}{ext}")


def free_backup_name(path: str, seconds: float) -> str:
    """`backup_name`, a millisecond later for each name taken already (plain or gzipped): two
    rotations within a millisecond must not make one backup of two."""
    while True:
        name = backup_name(path, seconds)
        if not (os.path.exists(name) or os.path.exists(name + ".gz")):
            return name
        seconds += 0.001


def _backup_time(name: str, stem: str, ext: str) -> float | None:
    """The time in a backup's name (compressed or not), or None when `name` is no backup of it."""
    if name.endswith(".gz"):
        name = name[:-3]
    if not (name.startswith(stem + "-") and name.endswith(ext)):
        return None
    stamp = name[len(stem) + 1 : len(name) - len(ext)]
    # 2006-01-02T15-04-05.000, read by hand: strptime is not for a mill's thread.
    parts = stamp[:10].split("-") + stamp[11:19].split("-")
    if len(stamp) != 23 or stamp[10] != "T" or stamp[19] != "." or len(parts) != 6:
        return None
    if not all(p.isdigit() for p in (*parts, stamp[20:])):
        return None
    year, month, day, hour, minute, second = (int(p) for p in parts)
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return None
    import calendar

    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    return seconds + int(stamp[20:]) / 1000


def mill(path: str, now: float | None = None) -> None:
    """lumberjack's mill for `path`'s backups: the five newest kept (a backup and its `.gz` being
    one), none older than 30 days, the rest removed, those kept gzipped. Never raises."""
    now = time.time() if now is None else now
    directory, name = os.path.split(path)
    directory = directory or "."
    stem, ext = os.path.splitext(name)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    backups: dict[float, list[str]] = {}
    for candidate in names:
        if candidate.endswith(".tmp") and candidate.startswith(stem + "-"):
            _remove_stale(os.path.join(directory, candidate), now)
            continue
        made = _backup_time(candidate, stem, ext)
        if made is not None:
            backups.setdefault(made, []).append(candidate)
    for rank, made in enumerate(sorted(backups, reverse=True)):
        files = backups[made]
        if rank >= MAX_BACKUPS or made < now - MAX_AGE_S:
            for stale in files:
                _unlink(os.path.join(directory, stale))
            continue
        packed = any(f.endswith(".gz") for f in files)
        for backup in files:
            if not backup.endswith(".gz"):
                _compress(os.path.join(directory, backup), packed)


def _compress(source: str, already: bool) -> None:
    """`source` gzipped beside it as `source.gz` (through a temporary file), then removed."""
    target = source + ".gz"
    if already and os.path.exists(target):
        _unlink(source)  # compressed before, the plain copy left by an interrupted mill
        return
    import gzip
    import shutil

    temporary = f"{target}.{os.getpid()}.tmp"
    try:
        mode = os.stat(source).st_mode & 0o777
        # Level 6, gzip's default and Go's, which lumberjack uses.
        with open(source, "rb") as plain, gzip.open(temporary, "wb", compresslevel=6) as packed:
            shutil.copyfileobj(plain, packed, 1024 * 1024)
        os.chmod(temporary, mode)
        os.rename(temporary, target)
        os.unlink(source)
    except OSError:
        _unlink(temporary)


def _remove_stale(path: str, now: float) -> None:
    """A temporary file of a compression that was killed midway."""
    try:
        if os.stat(path).st_mtime < now - _STALE_TEMP_S:
            os.unlink(path)
    except OSError:
        pass


def _unlink(path: str) -> None:
    try:  # noqa: SIM105 (contextlib would cost the plugin's start)
        os.unlink(path)
    except OSError:
        pass


SETTLE_S = 1.0
"""How long the detached mill waits before reading a backup: a plugin process that opened the file
just before it was renamed has written its line by then (one write, right after its open)."""


def mill_detached(path: str, settle_s: float = SETTLE_S) -> None:
    """`mill` in a child process of its own, detached from the caller's standard streams (the
    runtime reads the plugin's stdout until every copy of it is closed); the caller does not
    wait for it."""
    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        return
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        time.sleep(settle_s)
        mill(path)
    finally:
        os._exit(0)


# -- the plugin's log ----------------------------------------------------------------------------


class PluginLog:
    """ipamd-cni's log: where the conf's `pluginLogFile` says (a path, or `stderr`; no key: none),
    at and above its `pluginLogLevel` (VPC CNI's names; an unknown one is debug, as in VPC CNI)."""

    __slots__ = ("max_size", "path", "threshold")

    def __init__(self, path: str = "", level: str = "", max_size: int = MAX_SIZE) -> None:
        self.path = path
        self.threshold = level_number(level)
        self.max_size = max_size

    def enabled(self, level: str) -> bool:
        return bool(self.path) and LEVELS[level] >= self.threshold

    def event(self, level: str, name: str, **fields: object) -> None:
        """`name key=value ...` at `level`, the pairs also as fields; the caller's file and line."""
        if not self.enabled(level):
            return
        shown = " ".join(f"{key}={value}" for key, value in fields.items())
        self.write(level, f"{name} {shown}" if shown else name, fields, sys._getframe(1))

    def write(
        self, level: str, msg: str, fields: Mapping[str, object], frame: FrameType | None
    ) -> None:
        if not self.enabled(level):
            return
        caller = short_caller(frame.f_code.co_filename, frame.f_lineno) if frame else ""
        line = entry(level, timestamp(time.time()), "ipamd-cni", caller, msg, fields)
        data = (dumps(line) + "\n").encode()
        if self.path == STDERR:
            try:
                sys.stderr.write(data.decode())
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            return
        if append(self.path, data, self.max_size) is not None:
            mill_detached(self.path)


class Tee(io.StringIO):
    """The plugin's standard error as its commands write to it (`print(..., file=log)`): passed on,
    and each line also in the plugin's log at warn (without its `ipamd-cni: `), with the caller of
    `print`."""

    def __init__(self, stream: IO[str], log: PluginLog) -> None:
        super().__init__()
        self._stream = stream
        self._log = log
        self._pending = ""

    def write(self, text: str) -> int:
        self._stream.write(text)
        self._pending += text
        while "\n" in self._pending:
            line, _, self._pending = self._pending.partition("\n")
            if line:
                msg = line.removeprefix("ipamd-cni: ")
                self._log.write("warn", msg, {}, sys._getframe(1))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()
