"""NodeState's read side: every query answers from the indexes `apply` keeps, and what it hands out
is a live read-only view that cannot be written through."""

from __future__ import annotations

import pytest

from datastore.records import (
    AllocationKey,
    AllocationRecord,
    CooldownRecord,
    EniRecord,
    IntentRecord,
    Mutation,
    QuarantineRecord,
    ReleasedUnitRecord,
    UnitRecord,
)
from ipamd.engine.state import NodeState

T0 = 1_700_000_000.0
ENI_A = EniRecord("eni-a", 0, "subnet-1", True, T0, mac="0a:00:00:00:00:0a")
ENI_B = EniRecord("eni-b", 1, "subnet-1", False, T0)
SINGLE = UnitRecord("10.0.0.10/32", "eni-a", "ip", "active", T0)
OTHER = UnitRecord("10.0.0.11/32", "eni-a", "ip", "active", T0)
PREFIX = UnitRecord("10.0.1.0/28", "eni-b", "prefix", "active", T0)


def _key(cid: str, ifname: str = "eth0", network: str = "net") -> AllocationKey:
    return AllocationKey(network, cid, ifname)


def _alloc(key: AllocationKey, address: str, cidr: str, eni_id: str) -> AllocationRecord:
    return AllocationRecord(key, (address,), (cidr,), eni_id, T0)


def _state() -> NodeState:
    state = NodeState()
    state.apply(
        Mutation(
            put_enis=(ENI_A, ENI_B),
            put_units=(SINGLE, OTHER, PREFIX),
            put_released=(ReleasedUnitRecord("10.0.0.99/32", "eni-a", T0 - 5),),
            put_allocations=(
                _alloc(_key("pod", "eth1"), "10.0.1.3", PREFIX.cidr, "eni-b"),
                _alloc(_key("pod", "eth0"), "10.0.0.10", SINGLE.cidr, "eni-a"),
                _alloc(_key("other"), "10.0.1.4", PREFIX.cidr, "eni-b"),
            ),
            put_intents=(IntentRecord("gone", T0 - 1),),
            put_cooldowns=(CooldownRecord("10.0.0.11", T0 - 2),),
            put_quarantine=(QuarantineRecord(_key("odd"), ("10.0.9.9",), "why", T0),),
        )
    )
    return state


def test_the_inventory_by_eni_and_by_unit() -> None:
    state = _state()
    assert state.enis() == {"eni-a": ENI_A, "eni-b": ENI_B}
    assert state.eni("eni-a") == ENI_A and state.eni("eni-zz") is None
    assert list(state.units()) == [SINGLE.cidr, OTHER.cidr, PREFIX.cidr]
    assert state.unit(PREFIX.cidr) == PREFIX and state.unit("10.9.9.9/32") is None
    assert list(state.units_on("eni-a")) == [SINGLE.cidr, OTHER.cidr]
    assert list(state.units_on("eni-b")) == [PREFIX.cidr]
    assert list(state.units_on("eni-zz")) == []
    assert state.addresses_of(SINGLE.cidr) == ("10.0.0.10",)
    assert state.addresses_of(PREFIX.cidr) == tuple(f"10.0.1.{i}" for i in range(16))
    with pytest.raises(KeyError):
        state.addresses_of("10.9.9.9/32")
    assert (state.owned_in(SINGLE.cidr), state.owned_in(OTHER.cidr)) == (1, 0)
    assert (state.owned_in(PREFIX.cidr), state.owned_in("10.9.9.9/32")) == (2, 0)


def test_recently_released_units() -> None:
    state = _state()
    assert list(state.released()) == ["10.0.0.99/32"]
    released = state.released_unit("10.0.0.99/32")
    assert released is not None and released.released_at == T0 - 5
    assert state.released_unit(SINGLE.cidr) is None


def test_allocations_by_key_by_container_and_by_address() -> None:
    state = _state()
    assert len(state.allocations()) == 3
    held = state.allocation(_key("pod", "eth0"))
    assert held is not None and held.addresses == ("10.0.0.10",)
    assert state.allocation(_key("pod", "eth9")) is None
    assert [a.key.ifname for a in state.allocations_of("pod")] == ["eth0", "eth1"]
    assert state.allocations_of("nobody") == ()
    assert state.owner_of("10.0.1.4") == _key("other")
    assert state.owner_of("10.0.1.5") is None
    assert set(state.owned_addresses()) == {"10.0.0.10", "10.0.1.3", "10.0.1.4"}


def test_intents_cooldowns_and_quarantine() -> None:
    state = _state()
    assert state.intents() == {"gone": T0 - 1}
    assert state.cooldowns() == {"10.0.0.11": T0 - 2}
    assert state.is_cooling("10.0.0.11", T0, cooldown_s=30)
    assert not state.is_cooling("10.0.0.11", T0 + 28, cooldown_s=30)
    assert list(state.quarantine()) == [_key("odd")]


def test_views_follow_later_changes() -> None:
    state = _state()
    enis, units_on_a, owned = state.enis(), state.units_on("eni-a"), state.owned_addresses()
    allocations = state.allocations()
    state.apply(
        Mutation(
            delete_units=(OTHER.cidr,),
            delete_allocations=(_key("pod", "eth0"), _key("pod", "eth1")),
            delete_enis=("eni-b",),
        )
    )
    assert list(enis) == ["eni-a"]
    assert list(units_on_a) == [SINGLE.cidr]
    assert set(owned) == {"10.0.1.4"}
    assert list(allocations) == [_key("other")]
    assert state.allocations_of("pod") == ()
    assert state.owned_in(SINGLE.cidr) == 0


def test_views_cannot_be_written_through() -> None:
    state = _state()
    with pytest.raises(TypeError):
        state.enis()["eni-c"] = ENI_B  # type: ignore[index]
    with pytest.raises(TypeError):
        state.allocations()[_key("x")] = _alloc(_key("x"), "10.0.0.11", OTHER.cidr, "eni-a")  # type: ignore[index]
    with pytest.raises(AttributeError):
        state.units_on("eni-a").add("10.0.0.12/32")  # type: ignore[attr-defined]
    assert state.to_image() == _state().to_image(), "nothing changed"


def test_a_restored_state_answers_as_the_one_it_was_imaged_from() -> None:
    state = _state()
    restored = NodeState.from_image(state.to_image())
    assert restored.enis() == state.enis()
    assert restored.units() == state.units()
    assert restored.allocations() == state.allocations()
    assert restored.allocations_of("pod") == state.allocations_of("pod")
    assert set(restored.owned_addresses()) == set(state.owned_addresses())
    assert restored.intents() == state.intents()
    assert restored.cooldowns() == state.cooldowns()
    assert restored.quarantine() == state.quarantine()
    assert restored.released() == state.released()
