"""Subnet scarcity: while the subnets a node may draw from run short of free addresses, the node keeps
no warm pool above its minimum, so that what is left goes to the pods that need it (on this node or
another) instead of waiting, unused, in every node's pool. Azure CNS does this; VPC CNI keeps every
node's warm targets whatever the subnet has left.

- On when the free addresses of those subnets fall below the threshold
  (IPAMD_SUBNET_SCARCITY_THRESHOLD), off once they are at least `RECOVERY_FACTOR` times it. The gap
  is wider than what a node's own pool gives back when the mode turns on, so that a node (or a
  fleet) returning its warm addresses does not end the mode it is in, and is asked for them again.
- While it is on, the goal's warm part shrinks to its minimum (`scarce_goal`): WARM_IP_TARGET,
  WARM_ENI_TARGET and WARM_PREFIX_TARGET count as 0, MINIMUM_IP_TARGET stays, and the pool then
  gives back, through the usual shrinking, what lies above the minimum and the addresses in use.
  Pods' addresses are never touched: only wholly free units go back, as always.

docs/architecture.md §5.6 says how the pool manager reads the free addresses. Pure; no asyncio, no I/O.
"""

from __future__ import annotations

from dataclasses import replace

from ipamd.sizing.goals import Goal

RECOVERY_FACTOR = 2
"""The mode ends once the free addresses are at least this many times the threshold."""

SCARCE = "scarce"
"""The goal's name while the mode is on, for logs and metrics."""


def scarce_after(was_scarce: bool, free: int | None, threshold: int) -> bool:
    """Whether the mode is on after reading `free` addresses (None: never read), given whether it
    was on before. A threshold of 0 or less turns the mode off for good."""
    if threshold <= 0 or free is None:
        return False
    if was_scarce:
        return free < threshold * RECOVERY_FACTOR
    return free < threshold


def scarce_goal(goal: Goal) -> Goal:
    """`goal` with its warm part at its minimum: at most one free address kept (so that a pool with
    nothing free still grows, by what is short, and a pod waits one round at most), no wholly free
    unit, MINIMUM_IP_TARGET kept; single units may go back, and an ENI goes as soon as the pool
    without it still meets this goal.

    Never more than `goal` asks: MINIMUM_IP_TARGET alone (which keeps no free address) stays as it
    is."""
    return replace(
        goal,
        name=SCARCE,
        keep_available=min(goal.keep_available, 1),
        keep_free_units=0,
        fill_whole_enis=False,
        releases_units=True,
        eni_release_floor=0,
    )
