"""The child side of the S8 crash scenario with the cloud in the loop: where a kill is aimed, the plan
of one kill, a node run in a forkserver child until it is killed, and where in the child's work the kill
landed.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md."""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass

from tests.crash import reconcile_worker as worker
from tests.crash.test_s08_crash import (
    CHILD_TIMEOUT_S,
    CTX,
    _receive,
)

AIM_BUDGET = 40
"""Acknowledgements an aimed kill waits for its point at most."""
PROMISES = ("add", "del")
"""The step ops whose acknowledgements are promises to a pod."""


@dataclass(frozen=True, slots=True)
class Aim:
    """A point to kill near: the first trace message starting with `trace` inside a step `step`
    (any step if None)."""

    step: str | None
    trace: str
    label: str


AIMS = (
    Aim("pool", "committed\tunits:releasing", "units marked releasing, EC2 not yet asked"),
    Aim("pool", "ec2\tunassign_private_ip_addresses", "inside the unassign"),
    Aim("pool", "ec2done\tunassign_private_ip_addresses", "unassign answered, not committed"),
    Aim("pool", "ec2\tassign_private_ip_addresses", "inside the assign"),
    Aim("pool", "ec2done\tassign_private_ip_addresses", "assign answered, not committed"),
    Aim("pool", "ec2done\tcreate_network_interface", "ENI created, not attached"),
    Aim("pool", "ec2\tattach_network_interface", "inside the attach"),
    Aim("pool", "ec2done\tattach_network_interface", "ENI attached, not recorded"),
    Aim("pool", "ec2\tdetach_network_interface", "inside the detach"),
    Aim("pool", "ec2done\tdetach_network_interface", "ENI detached, not deleted"),
    Aim("pool", "ec2done\tdelete_network_interface", "ENI deleted, not removed"),
    Aim("drift", "ec2done\tdescribe_network_interfaces", "drift read EC2, not committed"),
    Aim("drift", "commit\t", "inside a drift commit"),
    Aim(None, "commit\t", "inside a commit"),
)
"""Where a random instant rarely falls (most of a child's time goes to Describe calls)."""


@dataclass(frozen=True, slots=True)
class NodeKillPlan:
    acks: int | None
    """Acknowledgements to wait for before the delay starts (when aiming: at most); None: the delay
    starts at the fork."""
    delay_s: float
    aim: Aim | None = None

    def __str__(self) -> str:
        after = "start" if self.acks is None else f"ack {self.acks}"
        if self.aim is not None:
            after = f"'{self.aim.label}' (or {after})"
        return f"kill {1000 * self.delay_s:.1f} ms after {after}"


def plan_kill(rng: random.Random, round_no: int) -> NodeKillPlan:
    r = rng.random()
    if round_no > 0 and r < 0.1:
        # Fork, open and restore, claim, the start-up drift and adopt take ~0.1-0.2 s.
        return NodeKillPlan(None, rng.uniform(0.0, 0.25))
    if r < 0.6:
        return NodeKillPlan(rng.randint(1, 30), rng.uniform(0.0, 0.03))
    return NodeKillPlan(AIM_BUDGET, rng.uniform(0.0, 0.003), rng.choice(AIMS))


def node_until_killed(args: worker.ChildArgs, plan: NodeKillPlan) -> tuple[list[str], bool]:
    """Start a node child, SIGKILL it as planned, reap it; return every message it sent and whether
    the aim (if any) was met (blocking).

    As in the churn test, the parent keeps reading after the kill: what was sent before is in the pipe.
    """
    reader, writer = CTX.Pipe(duplex=False)
    child = CTX.Process(target=worker.run, args=(args, writer), name=f"node-{args.tag}")
    messages: list[str] = []
    hit = False
    try:
        child.start()
        writer.close()
        if plan.acks is not None:
            acks, step = 0, None
            aim = plan.aim
            deadline = time.monotonic() + CHILD_TIMEOUT_S
            while acks < plan.acks and (message := _receive(reader, deadline)) is not None:
                messages.append(message)
                kind, _, rest = message.partition("\t")
                if kind == "call":
                    step = rest.split("\t")[1]
                elif kind == "ack":
                    acks, step = acks + 1, None
                elif (
                    aim is not None
                    and kind == "trace"
                    and rest.startswith(aim.trace)
                    and aim.step in (None, step)
                ):
                    hit = True
                    break
        time.sleep(plan.delay_s)
        child.kill()
        child.join(CHILD_TIMEOUT_S)
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while (message := _receive(reader, deadline)) is not None:
            messages.append(message)
        assert child.exitcode == -signal.SIGKILL, (
            f"the child ended by itself (exit code {child.exitcode}): {messages[-3:]}"
        )
        return messages, hit
    finally:
        reader.close()
        writer.close()
        if child.is_alive():
            child.kill()
            child.join()
        child.close()


def landing(messages: list[str]) -> str:
    """Where the kill landed, from the last step begun and the last trace inside it."""
    step: str | None = None
    trace: list[str] | None = None
    opened = False
    for message in messages:
        kind, *fields = message.split("\t")
        if kind == "open":
            opened = True
        elif kind == "call":
            step, trace = fields[1], None
        elif kind == "ack":
            step, trace = None, None
        elif kind == "trace":
            trace = fields
    if not opened:
        return "start: opening and restoring the state file"
    if step is None:
        return "between steps"
    step = f"churn {step.upper()}" if step in PROMISES else step
    if trace is None:
        return f"{step}: deciding, nothing sent or committed yet"
    return f"{step}: {inside_step(*trace)}"


def inside_step(what: str, name: str, *outcome: str) -> str:
    if what == "ec2":
        return f"inside EC2 {name}"
    if what == "ec2done":
        return f"EC2 {name} answered ({outcome[0]}), next call or commit not begun"
    if what == "commit":
        return f"inside commit [{name}]"
    return f"commit [{name}] done, next call or commit not begun"
