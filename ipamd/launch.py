"""`ipamd`'s console script: SIGINT and SIGTERM handled from its first instant, before the daemon's
modules are imported.

Importing `ipamd.main` (aiohttp, boto3, grpc; moto too under `--embedded`) takes about a second,
and a Ctrl-C in that second used to end in a traceback through the imports. Here, before anything
else, both signals stop the start: ipamd prints one line (`ipamd: stopped by SIGINT while
starting`) and exits 0, as a stop after ready does. This holds until `ipamd.main.serve` takes the
signals over on its event loop, from which on a stop is an orderly one (`daemon.stopped`).

It imports only the standard library's `signal` and `sys` before the handlers are in place, and
nothing of ipamd but `ipamd.main`, which it imports only then.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import NoReturn


class Stopped(BaseException):
    """A signal arrived before the event loop handles them. A BaseException, as KeyboardInterrupt
    is: no `except Exception` on the way out of an import catches it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, _frame: FrameType | None) -> NoReturn:
    raise Stopped(signum)


def main() -> int:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop)
    try:
        from ipamd.main import main as run

        return run()
    except Stopped as stopped:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C does not cut the line short
        name = signal.Signals(stopped.signum).name
        print(f"ipamd: stopped by {name} while starting", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
