"""The cloud's errors, translated at the edge from AWS error codes. Callers match on the type and the
`retryable` flag, never on message text; botocore exceptions never leave `cloud/`."""

from __future__ import annotations

from typing import ClassVar


class CloudError(Exception):
    retryable: ClassVar[bool] = False

    def __init__(self, operation: str, code: str, message: str = "") -> None:
        self.operation = operation
        self.code = code
        super().__init__(f"{operation}: {code}{': ' + message if message else ''}")


class Throttled(CloudError):
    """RequestLimitExceeded and friends: slow down and retry."""

    retryable = True


class ServiceUnavailable(CloudError):
    """A 5xx answer or a dropped connection: retry."""

    retryable = True


class CallTimeout(CloudError):
    """The call did not answer in time; its outcome is unknown, so the caller re-reads before acting."""

    retryable = True


class AddressLimitExceeded(CloudError):
    """PrivateIpAddressLimitExceeded: the ENI holds all the addresses or prefixes it can."""


class AttachmentLimitExceeded(CloudError):
    """AttachmentLimitExceeded: the instance has all the ENIs it can attach."""


class SubnetExhausted(CloudError):
    """InsufficientFreeAddressesInSubnet: the subnet cannot give more."""


class SubnetFragmented(SubnetExhausted):
    """InsufficientCidrBlocks: the subnet has addresses left but no free aligned /28, so a prefix
    cannot be had there while a secondary address still can."""


class InUse(CloudError):
    """InvalidNetworkInterface.InUse: e.g. deleting an attached ENI."""


class NotFound(CloudError):
    """The ENI, attachment or address does not exist (any more)."""


class Rejected(CloudError):
    """Any other permanent refusal (bad parameter, permission denied)."""
