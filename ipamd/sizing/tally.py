"""Counting a node's pool: per ENI and for the whole node, in addresses and in wholly free units.

Sizes come from each unit (`UnitStats.size`), never from the mode, so a pool that holds units of
both kinds (leftovers of a mode switch, or secondary IPs added while prefix mode falls back) is
counted right. Pure; no asyncio, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ipamd.sizing.inputs import EniStats, NodeStats, UnitStats


@dataclass(slots=True)
class PoolTally:
    """The node's pool, counted the way the targets are stated. Mutable: the planner updates it as
    it decides to add or remove units, so each later decision sees the pool the plan leaves."""

    total: int = 0
    """Addresses in units that are not releasing (VPC CNI's TotalIPs)."""
    available: int = 0
    """Free addresses in units that are not releasing. Cooling addresses are not available."""
    assigned: int = 0
    cooling: int = 0
    free_units: int = 0
    """Wholly free units of the mode's size: what WARM_PREFIX_TARGET counts."""
    releasing_units: int = 0
    leftovers: int = 0
    """Units set aside as leftovers (`tally_node`'s `set_aside_smaller`): not counted above."""

    def add(self, addresses: int, free_units: int) -> None:
        """Free units added (they arrive wholly free)."""
        self.total += addresses
        self.available += addresses
        self.free_units += free_units

    def remove(self, addresses: int, free_units: int) -> None:
        """Wholly free units removed (only those are ever released)."""
        self.total -= addresses
        self.available -= addresses
        self.free_units -= free_units


@dataclass(slots=True)
class EniTally:
    """One ENI, counted once."""

    stats: EniStats
    used: int = 0
    """Assigned and cooling addresses: the pods it serves now or just served."""
    available: int = 0
    """Free addresses in its units that are not releasing (= its total when it is all free)."""
    slots: int = 0
    """Units it holds, releasing ones included: EC2 counts them until the unassign completes."""
    releasing: bool = False
    free: list[UnitStats] = field(default_factory=list)
    """Its wholly free units, in the order the stats list them."""
    free_units: int = 0
    """How many of `free` have the mode's size."""
    leftovers: list[UnitStats] = field(default_factory=list)
    """Its wholly free units smaller than the mode's, when they are set aside: they take their
    slots, but are neither in `free` nor counted in `available`."""

    @property
    def all_free(self) -> bool:
        """Nothing on it is used or in flight: it could go as a whole."""
        return self.used == 0 and not self.releasing


@dataclass(slots=True)
class NodeTally:
    pool: PoolTally
    enis: list[EniTally]


def tally_node(stats: NodeStats, unit_size: int, *, set_aside_smaller: bool = False) -> NodeTally:
    """Count `stats`; `unit_size` is the mode's unit size, for counting wholly free units.
    `set_aside_smaller`: wholly free units smaller than that are leftovers, not the pool's
    (`ipamd.sizing.prefix_return`); they still take their ENI's slots."""
    pool = PoolTally()
    enis: list[EniTally] = []
    for eni in stats.enis:
        entry = EniTally(eni, slots=len(eni.units))
        for unit in eni.units:
            entry.used += unit.assigned + unit.cooling
            if unit.releasing:
                entry.releasing = True
                pool.releasing_units += 1
                continue
            if set_aside_smaller and unit.wholly_free and unit.size < unit_size:
                entry.leftovers.append(unit)
                pool.leftovers += 1
                continue
            entry.available += unit.free
            pool.total += unit.size
            pool.assigned += unit.assigned
            pool.cooling += unit.cooling
            if unit.wholly_free:
                entry.free.append(unit)
                entry.free_units += int(unit.size == unit_size)
        pool.available += entry.available
        pool.free_units += entry.free_units
        enis.append(entry)
    return NodeTally(pool, enis)
