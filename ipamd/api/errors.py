"""Errors only the HTTP layer raises, in the daemon's `IpamdError` tree so that one middleware maps
them all to a status and a stable `code`."""

from __future__ import annotations

from ipamd.errors import IpamdError
from ipamd.wire import (
    CODE_ALLOCATION_NOT_FOUND,
    CODE_METHOD_NOT_ALLOWED,
    CODE_NOT_FOUND,
    CODE_NOT_READY,
    CODE_PAYLOAD_TOO_LARGE,
    CODE_REQUEST_TIMEOUT,
    CODE_UNSUPPORTED_MEDIA_TYPE,
)


class NotFound(IpamdError):
    code = CODE_NOT_FOUND
    status = 404


class MethodNotAllowed(IpamdError):
    code = CODE_METHOD_NOT_ALLOWED
    status = 405


class PayloadTooLarge(IpamdError):
    code = CODE_PAYLOAD_TOO_LARGE
    status = 413


class RequestTimeout(IpamdError):
    """The body did not arrive in time: the connection is not held open for a client that stalls."""

    code = CODE_REQUEST_TIMEOUT
    status = 408
    retryable = True


class UnsupportedMediaType(IpamdError):
    code = CODE_UNSUPPORTED_MEDIA_TYPE
    status = 415


class AllocationNotFound(IpamdError):
    """No allocation for the attachment asked about (CHECK of an attachment ipamd does not hold)."""

    code = CODE_ALLOCATION_NOT_FOUND
    status = 404


class NotReady(IpamdError):
    """Restore or the first EC2 reconcile has not finished, or the state file is unusable."""

    code = CODE_NOT_READY
    status = 503
    retryable = True
