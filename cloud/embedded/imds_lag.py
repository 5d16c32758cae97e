"""The IMDS simulator's lag model: what it has seen of each address and prefix in EC2 (`Sighting`),
and `Staleness`, which serves IMDS's per-ENI lists late in both directions (a new unit shows after
`add_lag_s`, a returned one lingers for `remove_lag_s`), with knobs to keep, hide, release and
freeze units. Reads EC2 through the function it is given; no HTTP here (`imds_sim` serves it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cloud.ports import ImdsInterface
from cloud.ratelimit import MonotonicClock

Clock = MonotonicClock
"""Tokens expire and lags elapse by it (`time.monotonic` by default; tests inject a fake)."""


@dataclass(slots=True)
class Sighting:
    """What the simulator has observed of one address or prefix in EC2."""

    mac: str
    """The ENI it is (or was last) on."""
    is_prefix: bool
    first_seen: float | None
    """When it was first observed in its current stay on EC2; None if present at the first
    observation (IMDS has always had it)."""
    last_seen: float
    """The last observation that found it in EC2."""
    gone_since: float | None = None
    """The first observation that no longer found it in EC2; None while EC2 lists it."""
    settled: bool = False
    """`Staleness.release` said IMDS has caught up with it: time lags no longer apply."""


class Staleness:
    """How IMDS's address lists trail EC2's. Every knob is off at first: IMDS serves EC2 as it is."""

    def __init__(self, read_ec2: Callable[[], tuple[ImdsInterface, ...]], clock: Clock) -> None:
        self.add_lag_s = 0.0
        """An address or prefix EC2 assigns shows in IMDS only this long after it was observed."""
        self.remove_lag_s = 0.0
        """An address or prefix EC2 releases stays in IMDS this long after it was observed gone."""
        self._read_ec2 = read_ec2
        self._clock = clock
        self._sightings: dict[str, Sighting] = {}
        self._baseline_taken = False
        self._kept: set[str] = set()
        self._hidden: set[str] = set()
        self._frozen: tuple[ImdsInterface, ...] | None = None

    def keep(self, *cidrs: str) -> None:
        """Keep serving these addresses or prefixes after EC2 releases them ("keep released"), on the
        ENI they were on, until `release`. Observes EC2 first, so call it while EC2 still has them."""
        self.observe()
        self._kept.update(cidrs)
        self._hidden.difference_update(cidrs)

    def hide(self, *cidrs: str) -> None:
        """Do not serve these addresses or prefixes while EC2 lists them ("miss new"), until
        `release`. A primary address is never hidden."""
        self._hidden.update(cidrs)
        self._kept.difference_update(cidrs)

    def release(self, *cidrs: str) -> None:
        """IMDS catches up on these: serve them as EC2 has them now, time lags included."""
        self._kept.difference_update(cidrs)
        self._hidden.difference_update(cidrs)
        for cidr in cidrs:
            if (sighting := self._sightings.get(cidr)) is not None:
                sighting.settled = True

    def freeze(self) -> None:
        """Serve the lists as they are served now (ENIs included) until `thaw`."""
        self._frozen = None
        self._frozen = self.view()

    def thaw(self) -> None:
        self._frozen = None

    def clear(self) -> None:
        """Every knob off: serve EC2 as it is."""
        self.add_lag_s = self.remove_lag_s = 0.0
        self._kept.clear()
        self._hidden.clear()
        self._frozen = None
        for sighting in self._sightings.values():
            sighting.settled = True

    def sighting(self, cidr: str) -> Sighting | None:
        """The record of an address or prefix (None once it is gone and no longer served)."""
        return self._sightings.get(cidr)

    def observe(self) -> tuple[ImdsInterface, ...]:
        """Read EC2 now and update the sightings; returns EC2's view."""
        now, ec2 = self._clock(), self._read_ec2()
        listed: set[str] = set()
        for eni in ec2:
            for cidr, is_prefix in _units(eni):
                listed.add(cidr)
                self._sight(cidr, eni.mac, is_prefix, now)
        for cidr, sighting in list(self._sightings.items()):
            if cidr in listed:
                continue
            if sighting.gone_since is None:
                sighting.gone_since, sighting.settled = now, False
            expired = sighting.settled or now >= sighting.gone_since + self.remove_lag_s
            if expired and cidr not in self._kept:
                del self._sightings[cidr]
        self._baseline_taken = True
        return ec2

    def view(self) -> tuple[ImdsInterface, ...]:
        """What IMDS serves now: EC2 (observed now) with the knobs applied."""
        ec2 = self.observe()
        if self._frozen is not None:
            return self._frozen
        now = self._clock()
        return tuple(self._serve(eni, now) for eni in ec2)

    def _sight(self, cidr: str, mac: str, is_prefix: bool, now: float) -> None:
        sighting = self._sightings.get(cidr)
        if sighting is None or sighting.gone_since is not None or sighting.mac != mac:
            first_seen = now if self._baseline_taken else None
            self._sightings[cidr] = Sighting(mac, is_prefix, first_seen, now)
        else:
            sighting.last_seen = now

    def _serve(self, eni: ImdsInterface, now: float) -> ImdsInterface:
        primaries, secondaries = eni.local_ipv4s[:1], eni.local_ipv4s[1:]
        ips = [*primaries, *(a for a in secondaries if self._shown(a, now))]
        prefixes = [p for p in eni.ipv4_prefixes if self._shown(p, now)]
        for cidr, sighting in self._sightings.items():
            if sighting.mac == eni.mac and self._lingers(cidr, sighting, now):
                (prefixes if sighting.is_prefix else ips).append(cidr)
        return replace(eni, local_ipv4s=tuple(ips), ipv4_prefixes=tuple(prefixes))

    def _shown(self, cidr: str, now: float) -> bool:
        if cidr in self._hidden:
            return False
        sighting = self._sightings.get(cidr)
        if sighting is None or sighting.settled or sighting.first_seen is None:
            return True
        return now >= sighting.first_seen + self.add_lag_s

    def _lingers(self, cidr: str, sighting: Sighting, now: float) -> bool:
        if sighting.gone_since is None:
            return False
        if cidr in self._kept:
            return True
        return not sighting.settled and now < sighting.gone_since + self.remove_lag_s


def _units(eni: ImdsInterface) -> list[tuple[str, bool]]:
    """The ENI's secondary addresses and prefixes, each with whether it is a prefix."""
    return [(a, False) for a in eni.local_ipv4s[1:]] + [(p, True) for p in eni.ipv4_prefixes]
