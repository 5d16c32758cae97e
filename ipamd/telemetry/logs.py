"""Logging set-up: JSON lines on standard error (under the DaemonSet, or when asked) or readable text on
a terminal, and the same JSON lines in the node's log file, `/var/log/aws-routed-eni/ipamd.log`
(`AWS_VPC_K8S_CNI_LOG_FILE`), where aws-node writes its own and the EKS log collector looks.

Events are `logger.info("area.event key=%s other=%d", value, count)`. A JSON line has VPC CNI's fields
(`ipamd.cni.logfile`): `level`, `ts`, `logger`, `caller`, `msg` (the event as it reads, rendered as
`logging` renders it), and then each `key=%x` of the format paired with its argument, a field of its
own with the value's JSON type: a list stays a list, a count a number, a dataclass an object, a
`%r` string the string. The pairs come from the format string and the arguments, never from the
rendered text, so a value holding spaces or `=` is whole. Only a `key=` written right before a
placeholder is a field; `%.1f` gives the number rounded as shown, `%o` and `%x` their text.

The file is rotated as VPC CNI rotates its logs (100 MB, five gzipped backups, 30 days); a file that
cannot be opened is said once on standard error and ipamd goes on without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Mapping

from ipamd.cni import logfile

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}
"""VPC CNI's level names (`AWS_VPC_K8S_CNI_LOGLEVEL`) as `logging`'s levels."""
_NAMES = {number: name for name, number in LEVELS.items()}

LIBRARIES_AT_INFO = ("botocore", "boto3", "urllib3", "s3transfer", "moto", "werkzeug")
"""Libraries whose debug lines are requests and answers whole (signed headers, bodies): at debug,
ipamd's own lines are debug and these stay at info."""

_PLACEHOLDER = re.compile(
    r"%(?:\((?P<name>[^)]*)\))?(?P<flags>[-#0 +]*)(?P<width>\*|\d+)?(?:\.(?P<precision>\*|\d+))?"
    r"[hlL]?(?P<conversion>[diouxXeEfFgGcrsa%])"
)
_KEY = re.compile(r"(?:^|[\s,;(\[{])(?P<key>[A-Za-z_][\w.-]*)=$")
_MAX_DEPTH = 6


def event_fields(record: logging.LogRecord) -> dict[str, object]:
    """The `key=%x` pairs of the record's format with their arguments' values; {} when the format
    and the arguments do not pair (the line keeps its `msg`)."""
    fmt, args = record.msg, record.args
    if not isinstance(fmt, str) or not args:
        return {}
    try:
        return _pairs(fmt, args)
    except Exception:  # a value whose str() or int() fails: the line still goes out
        return {}


def _pairs(fmt: str, args: tuple[object, ...] | Mapping[str, object]) -> dict[str, object]:
    fields: dict[str, object] = {}
    position = 0
    for match in _PLACEHOLDER.finditer(fmt):
        conversion = match["conversion"]
        if conversion == "%":
            continue
        if "*" in (match["width"] or "") + (match["precision"] or ""):
            return {}
        if match["name"] is not None:
            if not isinstance(args, Mapping):
                return {}
            value = args[match["name"]]
        else:
            if not isinstance(args, tuple) or position >= len(args):
                return {}
            value = args[position]
            position += 1
        key = _KEY.search(fmt, 0, match.start())
        if key is None:
            continue
        name = key["key"]
        while name in fields:
            name += "_"
        fields[name] = _typed(value, match)
    if isinstance(args, tuple) and position != len(args):
        return {}
    return fields


def _typed(value: object, placeholder: re.Match[str]) -> object:
    """The placeholder's value as JSON: numbers as numbers (rounded as `%.Nf` shows them), `%s` and
    `%r` values by their type (`jsonable`), `%o`, `%x` and `%c` as the text they render."""
    conversion = placeholder["conversion"]
    if conversion in "diu":
        return value if isinstance(value, bool) else int(value)  # type: ignore[call-overload]
    spec = (
        placeholder[0]
        if placeholder["name"] is None
        else placeholder[0].replace(f"({placeholder['name']})", "", 1)
    )
    if conversion in "eEfFgG":
        number = float(spec % (value,))
        return number if math.isfinite(number) else spec % (value,)
    if conversion in "oxXc":
        return spec % (value,)
    return jsonable(value, conversion)


def jsonable(value: object, conversion: str = "s", depth: int = 0) -> object:
    """`value` as a JSON value of its own type: None, booleans, numbers and strings as they are;
    lists, tuples and sets as lists; mappings as objects; a dataclass as the object of its fields;
    anything else as the text `%s` (or `%r`, `%a`) renders."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth < _MAX_DEPTH:
        if isinstance(value, (list, tuple)):
            return [jsonable(v, conversion, depth + 1) for v in value]
        if isinstance(value, (set, frozenset)):
            items = [jsonable(v, conversion, depth + 1) for v in value]
            return sorted(items, key=lambda item: json.dumps(item, default=str))
        if isinstance(value, Mapping):
            return {str(k): jsonable(v, conversion, depth + 1) for k, v in value.items()}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                f.name: jsonable(getattr(value, f.name), conversion, depth + 1)
                for f in dataclasses.fields(value)
                if f.repr
            }
    if conversion == "r":
        return repr(value)
    if conversion == "a":
        return ascii(value)
    return str(value)


class JsonFormatter(logging.Formatter):
    """A record as one line of VPC CNI's fields (`ipamd.cni.logfile.entry`), compact JSON."""

    def format(self, record: logging.LogRecord) -> str:
        trace = None
        if record.exc_info:
            trace = self.formatException(record.exc_info)
        if record.stack_info:
            trace = f"{trace}\n{record.stack_info}" if trace else record.stack_info
        line = logfile.entry(
            level=_NAMES.get(record.levelno, record.levelname.lower()),
            ts=logfile.timestamp(record.created),
            logger=record.name,
            caller=logfile.short_caller(record.pathname, record.lineno),
            msg=record.getMessage(),
            fields=event_fields(record),
            stacktrace=trace,
        )
        return json.dumps(line, separators=(",", ":"), default=str)


class NodeLogFile(logging.Handler):
    """The node's log file: each line appended in one write, rotated by size as VPC CNI's
    lumberjack rotates it (`ipamd.cni.logfile`), the backups compressed and pruned on a thread.
    A failed write is said once on standard error (`log.file_failed`); later ones are not."""

    def __init__(self, path: str, max_size: int = logfile.MAX_SIZE) -> None:
        super().__init__()
        self.path = path
        self.max_size = max_size
        self._fd = -1
        self._size = 0
        self._open()  # raises OSError: configure_logging says so
        self._failed = False
        # At start too, for what a previous run left (lumberjack mills when it opens the file).
        self.milling = self.mill()
        """The thread compressing and pruning the backups, the last one started."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
            if self._fd < 0:  # a rotation could not open the new file: again, now
                self._open()
            if self._size + len(data) > self.max_size:
                self._size = os.fstat(self._fd).st_size  # the file may have been truncated
                if self._size and self._size + len(data) > self.max_size:
                    self.rotate()
            os.write(self._fd, data)
            self._size += len(data)
        except Exception:
            self.handleError(record)

    def rotate(self) -> None:
        """The full file renamed to its backup name, a new one opened, the backups milled."""
        os.close(self._fd)
        self._fd = -1
        with contextlib.suppress(OSError):  # renamed or removed by hand: a new file all the same
            os.rename(self.path, logfile.free_backup_name(self.path, time.time()))
        self._open()
        self.milling = self.mill()

    def _open(self) -> None:
        self._fd = logfile.open_append(self.path)
        self._size = os.fstat(self._fd).st_size

    def mill(self) -> threading.Thread:
        thread = threading.Thread(
            target=logfile.mill, args=(self.path,), name="log-mill", daemon=True
        )
        thread.start()
        return thread

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        if self._failed:
            return
        self._failed = True
        error = sys.exc_info()[1]
        failed = logging.LogRecord(
            __name__,
            logging.WARNING,
            __file__,
            0,
            "log.file_failed path=%s error=%s: ipamd logs to its standard error only until "
            "writing works again",
            (self.path, error),
            None,
        )
        for handler in logging.getLogger().handlers:
            if handler is not self:
                handler.handle(failed)

    def close(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        super().close()


def configure_logging(log_format: str, level: str, log_file: str | None = None) -> None:
    """`auto` is text on a terminal and JSON otherwise (a DaemonSet's stderr is no terminal); the
    file (None: none) is always JSON, the same lines as standard error's. `level`: VPC CNI's names."""
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if use_json
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, NodeLogFile):
            old.close()
    root.handlers[:] = [handler]
    number = LEVELS[level.lower()]
    root.setLevel(number)
    # The scheduler narrates every run at INFO; ipamd's jobs log what they find themselves.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    for library in LIBRARIES_AT_INFO:
        logging.getLogger(library).setLevel(max(number, logging.INFO))
    if log_file is None:
        return
    try:
        file_handler = NodeLogFile(log_file)
    except OSError as err:
        logging.getLogger(__name__).warning(
            "log.file_unavailable path=%s error=%s: ipamd logs to its standard error only",
            log_file,
            os.strerror(err.errno) if err.errno else str(err),
        )
        return
    file_handler.setFormatter(JsonFormatter())
    root.addHandler(file_handler)
