"""The child of the crash scenario (S8): churns ADD and DEL against a real engine on a real state file
until it is killed.

Every call is reported on the parent's pipe twice: a `call` message just before the engine is
asked and an `ack` message once it has answered. Each message is one unbuffered write of a few dozen
bytes, which a pipe delivers whole, so whatever the parent reads was sent before the kill and an `ack`
means the engine returned. Only acknowledged operations are promises; the one `call` without an
`ack` is the operation the kill cut short.

Messages (tab-separated fields):
    open                                           the engine restored the state file
    unavailable <reason>                           the engine refused the file (fail closed)
    call <seq> <op> <target> <count>               about to call
    ack  <seq> <op> <target> <outcome> <addresses> the call returned (addresses comma separated)
    error <repr>                                   an unexpected exception; the child exits
ops: `eni` and `units` (seeding the inventory; the target is the ENI ID), `add` and `del` (the
target is the container ID; `count` is the number of addresses an `add` asks for).
outcomes: `ok`, `refused` (delete intent active), `no_address` (pool empty), `node_full` (every
address the node can hold is owned: a node with an address capacity).

This module must stay importable without side effects: the parent preloads it into a forkserver so
that starting a child costs a fork, not an interpreter start.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md.
"""

from __future__ import annotations

import asyncio
import random
from multiprocessing.connection import Connection
from pathlib import Path

from datastore.records import EniRecord
from ipamd.clock import SystemClock
from ipamd.engine.allocator import EngineParams
from ipamd.engine.engine import Engine
from ipamd.errors import DeleteIntentActive, NoAddressAvailable, NodeFull
from tests.support.node import key, secondary_ips

ENIS = 3
"""ENIs on the churned node."""
IPS_PER_ENI = 29
"""Secondary IPs per ENI (a c5.4xlarge's 30 per ENI, less the primary)."""
MAX_LIVE = 32
"""Allocations the child keeps at most; with the cooldown below the pool of 87 never runs dry."""
SETTINGS = EngineParams(cooldown_s=0.05)
"""A real but short cooldown: DELs write cooldown rows and ADDs prune them, yet addresses come back
within a few operations."""


def eni_id(index: int) -> str:
    return f"eni-{index:04d}"


def layout() -> dict[str, list[str]]:
    """The inventory the child seeds: unit CIDRs per ENI ID."""
    return {eni_id(i): secondary_ips(i, IPS_PER_ENI) for i in range(ENIS)}


def run(path: str, seed: int, tag: str, out: Connection) -> None:
    """Process entry point: churn until killed, reporting on `out`."""
    try:
        asyncio.run(Churn(Path(path), random.Random(seed), tag, out).run())
    except BaseException as err:
        out.send_bytes(f"error\t{err!r}".encode())
        raise


class Churn:
    def __init__(self, path: Path, rng: random.Random, tag: str, out: Connection) -> None:
        self.path = path
        self.rng = rng
        self.tag = tag
        self.out = out
        self.seq = 0
        self.created = 0
        self.live: list[str] = []
        self.deleted: list[str] = []

    def emit(self, *fields: str) -> None:
        # `send_bytes` writes a small message (length header and payload) with one write(2), at once.
        self.out.send_bytes("\t".join(fields).encode())

    async def run(self) -> None:
        engine = await Engine.open(self.path, SystemClock(), SETTINGS)
        try:
            if engine.unavailable is not None:
                self.emit("unavailable", str(engine.unavailable).replace("\t", " "))
                return
            self.live = sorted({k.container_id for k in engine.state.allocations()})
            self.deleted = list(engine.state.intents())
            self.emit("open")
            await self.seed(engine)
            while True:
                await self.step(engine)
        finally:
            await engine.close()

    async def seed(self, engine: Engine) -> None:
        """Idempotent: on a seeded file both calls decide there is nothing to do and commit nothing."""
        for index, (eni, cidrs) in enumerate(layout().items()):
            seq = self.call("eni", eni)
            added_at = SystemClock().now()
            await engine.add_eni(EniRecord(eni, index, "subnet-1", index == 0, added_at))
            self.emit("ack", seq, "eni", eni, "ok", "")
            seq = self.call("units", eni)
            await engine.add_units(eni, cidrs, "ip")
            self.emit("ack", seq, "units", eni, "ok", "")

    def call(self, op: str, target: str, count: int = 1) -> str:
        self.seq += 1
        seq = str(self.seq)
        self.emit("call", seq, op, target, str(count))
        return seq

    def new_container(self) -> str:
        self.created += 1
        return f"{self.tag}-{self.created:05d}"

    def choose(self) -> tuple[str, str, int]:
        """The next operation: (op, container ID, addresses wanted)."""
        r = self.rng.random()
        if r < 0.04 and self.deleted:
            return "add", self.rng.choice(self.deleted), 1  # refused: the DEL already came
        if r < 0.08 and self.deleted:
            return "del", self.rng.choice(self.deleted), 1  # a repeated DEL
        if r < 0.11:
            return "del", self.new_container(), 1  # a DEL for a container never added
        if r < 0.17 and self.live:
            return "add", self.rng.choice(self.live), 1  # a repeated ADD
        if not self.live or (r < 0.6 and len(self.live) < MAX_LIVE):
            return "add", self.new_container(), 2 if r < 0.2 else 1
        return "del", self.rng.choice(self.live), 1

    async def step(self, engine: Engine) -> None:
        op, cid, count = self.choose()
        seq = self.call(op, cid, count)
        if op == "del":
            released = await engine.release(key(cid))
            addresses = ",".join(a for r in released for a in r.addresses)
            self.emit("ack", seq, op, cid, "ok", addresses)
            if cid in self.live:
                self.live.remove(cid)
            if cid not in self.deleted:
                self.deleted.append(cid)
            return
        try:
            record = await engine.assign(key(cid), count=count)
        except DeleteIntentActive:
            self.emit("ack", seq, op, cid, "refused", "")
        except (NoAddressAvailable, NodeFull) as err:
            self.emit("ack", seq, op, cid, err.code, "")
        else:
            self.emit("ack", seq, op, cid, "ok", ",".join(record.addresses))
            if cid not in self.live:
                self.live.append(cid)
