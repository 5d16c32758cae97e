"""`plan_kernel` with a memo of the pods' rules plans what it plans without one, whatever moved
between two plans: pods come and go, an address moves to another ENI, an ENI moves its table."""

from __future__ import annotations

from datastore.records import AllocationRecord, EniRecord
from ipamd.hostnet.kernel_plan import PodRulesMemo, ReadyEni, plan_kernel
from tests.support.node import key

PRIMARY = EniRecord("eni-0", 0, "subnet-1", True, 0.0, "02:00:00:00:00:00", "10.0.0.10")


def _eni(index: int) -> EniRecord:
    return EniRecord(
        f"eni-{index}",
        index,
        "subnet-1",
        False,
        0.0,
        f"02:00:00:00:00:0{index}",
        f"10.0.{index}.10",
    )


def _pod(name: str, address: str, eni: EniRecord) -> AllocationRecord:
    return AllocationRecord(key(name), (address,), (f"{address}/32",), eni.eni_id, 0.0)


def test_the_memo_plans_what_a_fresh_plan_plans() -> None:
    one, two = _eni(1), _eni(2)
    moved_two = EniRecord(two.eni_id, 3, "subnet-1", False, 0.0, two.mac, two.primary_ip)
    ready = [ReadyEni(one, "eth1", "10.0.0.0/16")]
    steps = [
        ([_pod("a", "10.0.1.20", one), _pod("b", "10.0.0.21", PRIMARY)], [PRIMARY, one, two]),
        ([_pod("a", "10.0.1.20", one), _pod("c", "10.0.2.22", two)], [PRIMARY, one, two]),
        ([_pod("a", "10.0.1.20", two), _pod("c", "10.0.2.22", two)], [PRIMARY, one, two]),
        ([_pod("a", "10.0.1.20", two), _pod("c", "10.0.2.22", two)], [PRIMARY, one, moved_two]),
        ([_pod("a", "10.0.1.20", one), _pod("d", "10.0.9.9", _eni(9))], [PRIMARY, one]),
        ([], [PRIMARY]),
    ]
    memo: PodRulesMemo = {}
    for allocations, enis in steps:
        by_id = {e.eni_id: e for e in enis}
        planned = plan_kernel(allocations, by_id, ready, True, memo)
        assert planned == plan_kernel(allocations, by_id, ready, True)
        assert len(memo) == sum(len(a.addresses) for a in allocations), "this plan's pods alone"
