"""The SNAT plan both SNAT test modules start from: a node whose primary ENI is eth0 with one
secondary ENI, in a /16 VPC, with ports randomised."""

from __future__ import annotations

from ipamd.hostnet.snat import SnatPlan

PLAN = SnatPlan(
    primary_ip="10.0.1.10",
    primary_ifname="eth0",
    eni_ifnames=("eth0", "eth1"),
    exempt_cidrs=("10.0.0.0/16",),
    randomize="prng",
)
