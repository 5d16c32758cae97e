"""Errors only the HTTP layer raises, in the daemon's `IpamdError` tree so that one middleware maps
them all to a status and a stable `code`."""

from __future__ import annotations

from ipamd.errors import IpamdError


class NotFound(IpamdError):
    code = "not_found"
    status = 404


class MethodNotAllowed(IpamdError):
    code = "method_not_allowed"
    status = 405


class PayloadTooLarge(IpamdError):
    code = "payload_too_large"
    status = 413


class RequestTimeout(IpamdError):
    """The body did not arrive in time: the connection is not held open for a client that stalls."""

    code = "request_timeout"
    status = 408
    retryable = True


class UnsupportedMediaType(IpamdError):
    code = "unsupported_media_type"
    status = 415


class AllocationNotFound(IpamdError):
    """No allocation for the attachment asked about (CHECK of an attachment ipamd does not hold)."""

    code = "allocation_not_found"
    status = 404


class NotReady(IpamdError):
    """Restore or the first EC2 reconcile has not finished, or the state file is unusable."""

    code = "not_ready"
    status = 503
    retryable = True
