"""Where a zone's secondary ENIs go under custom networking: one ENIConfig, as VPC CNI names the
Kubernetes resource, reduced to the two fields ipamd uses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EniConfig:
    """The subnet and security groups of every secondary ENI of the nodes in one zone."""

    name: str
    """The key it is found by: the zone name, as VPC CNI's default `ENI_CONFIG_LABEL_DEF` keys it."""
    subnet_id: str
    security_groups: tuple[str, ...] = ()
    """Empty: the primary ENI's security groups, as VPC CNI does when ENIConfig names none."""
