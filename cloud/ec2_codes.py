"""EC2's error codes, read into `cloud.errors`: which code is which error, and whether EC2 surely did
not act on the request (what makes a retry of a call that is not repeatable safe). By code, never by
message text. No I/O and no botocore: `cloud.ec2` takes the code and status out of botocore's
exception and asks here.
"""

from __future__ import annotations

from collections.abc import Mapping

from cloud.errors import (
    AddressLimitExceeded,
    AttachmentLimitExceeded,
    CloudError,
    InUse,
    NotFound,
    Rejected,
    ServiceUnavailable,
    SubnetExhausted,
    SubnetFragmented,
    Throttled,
)
from cloud.ratelimit import AttemptFailed

_THROTTLED = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
_SHED = frozenset({"Unavailable", "ServiceUnavailable"})
"""EC2 was too busy to take the request: it did not act on it."""
_INTERNAL = frozenset({"InternalError", "InternalFailure"})
"""EC2 failed while handling the request: it may or may not have acted."""
_PERMANENT: Mapping[str, type[CloudError]] = {
    "PrivateIpAddressLimitExceeded": AddressLimitExceeded,
    "AttachmentLimitExceeded": AttachmentLimitExceeded,
    "InsufficientFreeAddressesInSubnet": SubnetExhausted,
    "InsufficientCidrBlocks": SubnetFragmented,
    "InvalidNetworkInterface.InUse": InUse,
}


def error_for_code(operation: str, code: str, message: str, status: int) -> AttemptFailed:
    """EC2's error answer (its code and HTTP status) as a `CloudError`, with whether EC2 surely did
    not act on the request."""
    if code in _THROTTLED:
        return AttemptFailed(Throttled(operation, code, message), not_applied=True)
    if code in _SHED or status == 503:
        return AttemptFailed(ServiceUnavailable(operation, code, message), not_applied=True)
    if code in _INTERNAL or status >= 500:
        return AttemptFailed(ServiceUnavailable(operation, code, message), not_applied=False)
    kind = _PERMANENT.get(code) or (NotFound if code.endswith(".NotFound") else Rejected)
    return AttemptFailed(kind(operation, code, message), not_applied=True)
