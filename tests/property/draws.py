"""Drawing engine steps for the stateful test: which containers, keys and units a step names.

It keeps the history the draws pick from (keys ADDed before, container IDs DELeted before) and the
node's small unit universe; it decides nothing about outcomes, which is the model's business.
Draws lean towards the cases that matter (live containers for DEL, units a release can act on)
without excluding the others.

What each scenario replays, and which tests prove it: docs/failure-scenarios.md.
"""

from __future__ import annotations

from typing import Literal

from hypothesis import strategies as st

from datastore.records import AllocationKey, UnitKind
from tests.property.model import (
    AbortRelease,
    Add,
    AddUnits,
    BeginRelease,
    Del,
    FinishRelease,
    Model,
    Step,
    UnitsGone,
)
from tests.support.node import prefixes, secondary_ips

Mode = Literal["ip", "prefix", "ipv6"]
ENI_IDS = ("eni-0000", "eni-0001")
NETWORKS = ("k8s-pod-network", "multus-net")
IFNAMES = ("eth0", "net1")
UNIVERSE: dict[Mode, dict[str, list[str]]] = {
    "ip": {eni: secondary_ips(i, 6) for i, eni in enumerate(ENI_IDS)},
    "prefix": {eni: prefixes(i, 2) for i, eni in enumerate(ENI_IDS)},
    "ipv6": {
        eni: [f"2600:1f14:abc:d0{i}:{n}::/80" for n in (1, 2)] for i, eni in enumerate(ENI_IDS)
    },
}
"""Every unit EC2 could list, per mode and ENI: small, so the pool runs dry within a run."""


class StepDraws:
    def __init__(self, mode: Mode = "ip") -> None:
        self.mode = mode
        self.fresh_ids = 0
        self.seen: list[AllocationKey] = []
        """Every key an ADD was tried for, in order: the pool for "a container seen before"."""
        self.deleted: list[str] = []
        """Every container ID a DEL was sent for."""

    @property
    def kind(self) -> UnitKind:
        kinds: dict[Mode, UnitKind] = {"ip": "ip", "prefix": "prefix", "ipv6": "ipv6_prefix"}
        return kinds[self.mode]

    def first_units(self, count: int) -> AddUnits:
        return AddUnits(ENI_IDS[0], tuple(UNIVERSE[self.mode][ENI_IDS[0]][:count]), self.kind)

    def fresh_key(self) -> AllocationKey:
        """A container ID never used before."""
        self.fresh_ids += 1
        return AllocationKey(NETWORKS[0], f"ctr-{self.fresh_ids:04d}", IFNAMES[0])

    def remember(self, step: Step) -> None:
        if isinstance(step, Add) and step.key not in self.seen:
            self.seen.append(step.key)
        if isinstance(step, Del):
            self.deleted.append(step.key.container_id)

    def add(self, data: st.DataObject) -> Add:
        """ADD for a new container, a key seen before (live or not), another ifname/network of a
        container seen before (S27), or a container recently deleted."""
        choices = ["new", "new", "new"] + (["seen", "other_form"] if self.seen else [])
        choices += ["deleted", "deleted"] if self.deleted else []
        how = data.draw(st.sampled_from(choices), label="add")
        count = data.draw(st.sampled_from((1, 1, 1, 2)), label="count")
        if how == "new":
            return Add(self.fresh_key(), count)
        if how == "deleted":
            cid = data.draw(st.sampled_from(self.deleted), label="container")
            return Add(AllocationKey(NETWORKS[0], cid, IFNAMES[0]), count)
        seen = data.draw(st.sampled_from(self.seen), label="key")
        if how == "seen":
            return Add(seen, count)
        return Add(self.other_form(data, seen.container_id), count)

    def other_form(self, data: st.DataObject, container_id: str) -> AllocationKey:
        network = data.draw(st.sampled_from(NETWORKS), label="network")
        ifname = data.draw(st.sampled_from(IFNAMES), label="ifname")
        return AllocationKey(network, container_id, ifname)

    def delete(self, data: st.DataObject, model: Model) -> Del:
        """DEL for a live container, any container seen or deleted before (a repeat), or an unknown
        one. The key's ifname need not match: DEL covers every allocation of the container ID."""
        live = sorted({k.container_id for k in model.allocs})
        known = sorted({k.container_id for k in self.seen} | set(self.deleted))
        choices = (["live", "live"] if live else []) + (["known"] if known else []) + ["unknown"]
        how = data.draw(st.sampled_from(choices), label="del")
        if how == "unknown":
            return Del(self.fresh_key())
        cid = data.draw(st.sampled_from(live if how == "live" else known), label="container")
        ifname = data.draw(st.sampled_from(IFNAMES), label="ifname")
        return Del(AllocationKey(NETWORKS[0], cid, ifname))

    def cidrs(self, data: st.DataObject, preferred: list[str]) -> tuple[str, ...]:
        """A few units: half the time from `preferred` (the ones the step can act on), else any."""
        source = [c for cidrs in UNIVERSE[self.mode].values() for c in cidrs]
        use_preferred: bool = bool(preferred) and data.draw(st.booleans(), label="preferred")
        if use_preferred:
            source = preferred
        return tuple(data.draw(st.lists(st.sampled_from(source), min_size=1, max_size=3)))

    def add_units(self, data: st.DataObject) -> AddUnits:
        """Units of either ENI, attached or not (an unknown ENI is refused)."""
        eni_id = data.draw(st.sampled_from(ENI_IDS), label="eni")
        universe = UNIVERSE[self.mode][eni_id]
        cidrs = data.draw(st.lists(st.sampled_from(universe), min_size=1, max_size=3))
        return AddUnits(eni_id, tuple(cidrs), self.kind)

    def begin_release(self, data: st.DataObject, model: Model, now: float) -> BeginRelease:
        owned = model.owned_units()
        unowned = [c for c, u in model.units.items() if u.state == "active" and c not in owned]
        # Units with a cooling address count twice: the ones begin_release must refuse.
        cooling = [
            c for c in unowned if any(model.is_cooling(a, now) for a in model.known_addresses(c))
        ]
        return BeginRelease(self.cidrs(data, cooling + unowned))

    def finish_release(self, data: st.DataObject, model: Model) -> FinishRelease:
        return FinishRelease(self.cidrs(data, releasing(model)))

    def abort_release(self, data: st.DataObject, model: Model) -> AbortRelease:
        return AbortRelease(self.cidrs(data, releasing(model)))

    def units_gone(self, data: st.DataObject, model: Model) -> UnitsGone:
        return UnitsGone(self.cidrs(data, list(model.units)))

    def inventory(self, data: st.DataObject, model: Model, now: float) -> Step:
        """Any one inventory change."""
        what = data.draw(
            st.sampled_from(["add", "begin", "finish", "abort", "gone"]), label="inventory"
        )
        if what == "add":
            return self.add_units(data)
        if what == "begin":
            return self.begin_release(data, model, now)
        if what == "finish":
            return self.finish_release(data, model)
        if what == "abort":
            return self.abort_release(data, model)
        return self.units_gone(data, model)


def releasing(model: Model) -> list[str]:
    return [c for c, u in model.units.items() if u.state == "releasing"]
