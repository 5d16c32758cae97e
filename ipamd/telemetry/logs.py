"""Logging set-up: JSON lines under the DaemonSet (or when asked), readable text on a terminal.
Events are `logger.info("area.event key=%s", value)`; the JSON form carries the same message."""

from __future__ import annotations

import json
import logging
import sys


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(log_format: str, level: str) -> None:
    """`auto` is text on a terminal and JSON otherwise (a DaemonSet's stderr is no terminal)."""
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if use_json
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The scheduler narrates every run at INFO; ipamd's jobs log what they find themselves.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
