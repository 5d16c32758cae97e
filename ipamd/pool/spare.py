"""How long what the pool could give back stays before it goes (IPAMD_RELEASE_DELAY): an ENI, a
prefix or an address goes to EC2 only once the plan has wanted to free it for the delay without a
break (docs/architecture.md §5.4). Each costs calls to give back and calls to ask for again (five
from create to delete for an ENI), so a node whose pods hover at an edge keeps it instead. No delay
while the subnets are scarce (the addresses are wanted elsewhere), nor for what no new pod could
have (`serves_no_pod`) or the pool never grows again (the /32s of prefix mode's fallback): nothing
there is asked for again.
"""

from __future__ import annotations

from dataclasses import replace

from cloud.models import UnitKind
from ipamd.engine.engine import Engine
from ipamd.policy.plan import PoolPlan


class SpareDelay:
    def __init__(self, engine: Engine, delay_s: float) -> None:
        self._engine = engine
        self._delay_s = delay_s
        self._since: dict[str, float] = {}
        """ENIs and units the plan would give back, and since when it has without a break."""

    def settled(
        self, plan: PoolPlan, now: float, demand: bool, scarce: bool, kind: UnitKind
    ) -> PoolPlan:
        """`plan` giving back only what has been spare for the delay; a round with pods waiting
        (`demand`) is a break. Units of another kind than the pool grows (`kind`: the /32s prefix
        mode's fallback left) go at once: the pool never asks for them again."""
        wanted = () if demand else plan.release_enis + plan.release_units
        self._since = {k: self._since.get(k, now) for k in wanted}
        if not wanted or self._delay_s <= 0 or scarce:
            return plan
        idle = serves_no_pod(self._engine)
        units = self._engine.state.units()

        def ready(key: str) -> bool:
            unit = units.get(key)
            if unit is not None and unit.kind != kind:
                return True
            eni_id = key if unit is None else unit.eni_id
            return eni_id in idle or now - self._since[key] >= self._delay_s

        enis = tuple(e for e in plan.release_enis if ready(e))
        cidrs = tuple(c for c in plan.release_units if ready(c))
        if (enis, cidrs) == (plan.release_enis, plan.release_units):
            return plan
        return replace(plan, release_enis=enis, release_units=cidrs)


def serves_no_pod(engine: Engine) -> set[str]:
    """The ENIs whose addresses go to no new pod: held back (blocked, or in a closed subnet) and,
    under custom networking, the primary."""
    idle = set(engine.held_back())
    if not engine.settings.pods_on_primary:
        idle |= {e for e, r in engine.state.enis().items() if r.is_primary}
    return idle
