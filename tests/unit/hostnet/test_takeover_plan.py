"""The pure part of taking a node over from aws-node: which of VPC CNI's rules and routes go
(`plan_takeover`), and which of its iptables rules and chains (`plan_nft_removal`,
`plan_legacy_removal`), as tables of cases."""

from __future__ import annotations

import pytest

from ipamd.hostnet.aws_snat import parse_nft_table, plan_legacy_removal, plan_nft_removal
from ipamd.hostnet.kernel_plan import CONNMARK_RULE, KernelPlan, is_vpc_cni_rule, plan_takeover
from ipamd.hostnet.ports import (
    CONNMARK,
    MAIN_TABLE,
    PRIORITY_CONNMARK,
    PRIORITY_FROM_ENI,
    PRIORITY_FROM_POD,
    PRIORITY_TO_POD,
    Route,
    Rule,
)

OWNED = "10.0.1.21"
STALE = "10.0.1.22"
ELSEWHERE = "192.168.5.5"
"""Not in ipamd's inventory: some other software's address."""


def to_pod(address: str) -> Rule:
    return Rule(PRIORITY_TO_POD, MAIN_TABLE, dst=f"{address}/32")


def from_pod(address: str, table: int = 2) -> Rule:
    return Rule(PRIORITY_FROM_POD, table, src=f"{address}/32")


FROM_ENI = Rule(PRIORITY_FROM_ENI, 2, src="10.0.1.20/32")
GW = Route(2, "10.0.1.1/32", "eth1")
DEFAULT = Route(2, "0.0.0.0/0", "eth1", "10.0.1.1")
PLAN = KernelPlan(
    frozenset({to_pod(OWNED), from_pod(OWNED), FROM_ENI, CONNMARK_RULE}),
    frozenset({GW, DEFAULT}),
)
NO_SNAT = KernelPlan(PLAN.rules - {CONNMARK_RULE}, PLAN.routes)


def rules_going(foreign: set[Rule], plan: KernelPlan = PLAN) -> frozenset[Rule]:
    return plan_takeover(
        plan, (), foreign, (), owned={OWNED}, inventory={OWNED, STALE}
    ).delete_rules


@pytest.mark.parametrize(
    ("foreign", "why"),
    [
        (to_pod(OWNED), "ipamd's twin is in"),
        (from_pod(OWNED), "ipamd's twin is in"),
        (from_pod(OWNED, table=3), "ipamd's rule of that selector is in, whatever the table"),
        (FROM_ENI, "ipamd's twin is in"),
        (CONNMARK_RULE, "ipamd's twin is in"),
        (to_pod(STALE), "an inventory address no pod owns"),
        (from_pod(STALE), "an inventory address no pod owns"),
    ],
)
def test_a_vpc_cni_rule_goes(foreign: Rule, why: str) -> None:
    assert rules_going({foreign}) == {foreign}, why


@pytest.mark.parametrize(
    ("foreign", "why"),
    [
        (to_pod(ELSEWHERE), "not an address of ipamd's"),
        (from_pod(ELSEWHERE), "not an address of ipamd's"),
        (Rule(PRIORITY_FROM_ENI, 3, src="10.0.1.30/32"), "an ENI ipamd has not set up"),
        (Rule(PRIORITY_TO_POD, 100, dst=f"{STALE}/32"), "not VPC CNI's shape: table"),
        (Rule(PRIORITY_TO_POD, MAIN_TABLE, dst="10.0.1.0/24"), "not VPC CNI's shape: a /24"),
        (Rule(PRIORITY_FROM_POD, MAIN_TABLE, src=f"{STALE}/32"), "not VPC CNI's shape: main"),
        (Rule(PRIORITY_CONNMARK, MAIN_TABLE, fwmark=0x40, fwmask=0x40), "another mark"),
        (Rule(32000, 2, src=f"{STALE}/32"), "not a priority of VPC CNI's"),
    ],
)
def test_any_other_rule_stays(foreign: Rule, why: str) -> None:
    assert rules_going({foreign}) == frozenset(), why


def test_an_owned_address_keeps_vpc_cnis_rule_until_ipamd_has_its_own() -> None:
    unplanned = KernelPlan(frozenset({to_pod(OWNED)}), frozenset())
    assert rules_going({to_pod(OWNED), from_pod(OWNED)}, unplanned) == {to_pod(OWNED)}


def test_without_ipamds_connmark_rule_vpc_cnis_goes_too() -> None:
    """AWS_VPC_K8S_CNI_EXTERNALSNAT: the marks it routes are aws-node's, which go with its chains."""
    assert rules_going({CONNMARK_RULE}, NO_SNAT) == {CONNMARK_RULE}


def test_vpc_cni_shapes() -> None:
    assert is_vpc_cni_rule(Rule(PRIORITY_CONNMARK, MAIN_TABLE, fwmark=CONNMARK, fwmask=CONNMARK))
    assert not is_vpc_cni_rule(Rule(PRIORITY_CONNMARK, 2, fwmark=CONNMARK, fwmask=CONNMARK))
    assert not is_vpc_cni_rule(Rule(PRIORITY_TO_POD, MAIN_TABLE, src="10.0.1.5/32"))


def test_routes_of_an_eni_table_are_claimed_in_place_or_go_when_stale() -> None:
    stale = Route(2, "10.0.1.99/32", "eth1")
    other_table = Route(7, "0.0.0.0/0", "eth7", "10.0.7.1")
    not_a_vpc_cni_shape = Route(2, "10.0.9.0/24", "eth1")
    plan = plan_takeover(
        PLAN,
        {GW, DEFAULT},
        (),
        {GW, DEFAULT, stale, other_table, not_a_vpc_cni_shape},
        owned=set(),
        inventory=set(),
    )
    assert plan.claim_routes == {GW, DEFAULT}
    assert plan.delete_routes == {stale}


def test_a_foreign_twin_of_a_route_ipamd_already_has_goes() -> None:
    plan = plan_takeover(PLAN, (), (), {DEFAULT}, owned=set(), inventory=set())
    assert plan.claim_routes == frozenset()
    assert plan.delete_routes == {DEFAULT}


def test_nothing_foreign_is_an_empty_plan() -> None:
    assert plan_takeover(PLAN, {GW}, (), (), owned={OWNED}, inventory={OWNED}).is_empty()


# -- iptables-nft's tables as `nft -a list table` shows them -------------------------------------

NAT = """table ip nat { # handle 1
\tchain AWS-SNAT-CHAIN-0 { # handle 1
\t\tip daddr 10.0.0.0/16  counter packets 0 bytes 0 return # handle 4
\t\toifname != "vlan*"  fib daddr type != local counter packets 3 bytes 180 \
snat to 10.0.1.10 fully-random # handle 5
\t}

\tchain POSTROUTING { # handle 2
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\t counter packets 0 bytes 0 jump AWS-SNAT-CHAIN-0 # handle 3
\t\t counter packets 0 bytes 0 jump KUBE-POSTROUTING # handle 12
\t}

\tset kube-set { # handle 20
\t\ttype ipv4_addr
\t\telements = { 10.0.0.1,
\t\t\t     10.0.0.2 }
\t}

\tchain AWS-CONNMARK-CHAIN-0 { # handle 6
\t\tip daddr 10.0.0.0/16  counter packets 0 bytes 0 return # handle 10
\t\t counter packets 0 bytes 0 ct mark set ct mark or 0x80 # handle 11
\t}

\tchain PREROUTING { # handle 7
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tiifname "eni*"  counter packets 0 bytes 0 jump AWS-CONNMARK-CHAIN-0 # handle 8
\t\t counter packets 0 bytes 0 meta mark set ct mark and 0x80 # handle 9
\t\t counter packets 0 bytes 0 meta mark set ct mark and 0x4000 # handle 13
\t}
}
"""

MANGLE = """table ip mangle { # handle 2
\tchain PREROUTING { # handle 1
\t\ttype filter hook prerouting priority mangle; policy accept;
\t\tiifname "eth0"  fib daddr . iif type local counter packets 0 bytes 0 \
ct mark set ct mark or 0x80 # handle 2
\t\tiifname "eni*"  counter packets 0 bytes 0 meta mark set ct mark & 0x00000080 # handle 3
\t\tiifname "eth0" counter packets 0 bytes 0 meta mark set 0x1 # handle 4
\t}
}
"""


def test_the_nft_listing_is_read_chain_by_chain() -> None:
    chains, rules = parse_nft_table(NAT)
    assert chains == ["AWS-SNAT-CHAIN-0", "POSTROUTING", "AWS-CONNMARK-CHAIN-0", "PREROUTING"]
    assert [(r.chain, r.handle) for r in rules if r.chain == "POSTROUTING"] == [
        ("POSTROUTING", 3),
        ("POSTROUTING", 12),
    ]
    assert rules[0].text == "ip daddr 10.0.0.0/16 return"


def test_nft_removal_takes_vpc_cnis_rules_and_chains_and_nothing_else() -> None:
    script, removed = plan_nft_removal("nat", NAT)
    assert script == [
        "delete rule ip nat POSTROUTING handle 3",
        "delete rule ip nat PREROUTING handle 8",
        "delete rule ip nat PREROUTING handle 9",
        "flush chain ip nat AWS-SNAT-CHAIN-0",
        "delete chain ip nat AWS-SNAT-CHAIN-0",
        "flush chain ip nat AWS-CONNMARK-CHAIN-0",
        "delete chain ip nat AWS-CONNMARK-CHAIN-0",
    ]
    assert len(removed) == 5
    script, _ = plan_nft_removal("mangle", MANGLE)
    assert script == [
        "delete rule ip mangle PREROUTING handle 2",
        "delete rule ip mangle PREROUTING handle 3",
    ]


def test_a_table_without_vpc_cnis_rules_needs_no_batch() -> None:
    kube_only = (
        "table ip nat {\n\tchain POSTROUTING { # handle 2\n\t\tmasquerade # handle 3\n\t}\n}\n"
    )
    assert plan_nft_removal("nat", kube_only) == ([], [])


# -- iptables-legacy as iptables-legacy-save prints it ---------------------------------------------

SAVE = """# Generated by iptables-save v1.8.9
*mangle
:PREROUTING ACCEPT [0:0]
-A PREROUTING -i eth0 -m comment --comment "AWS, primary ENI" -m addrtype --dst-type LOCAL \
--limit-iface-in -j CONNMARK --set-xmark 0x80/0x80
-A PREROUTING -i eni+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark \
--nfmask 0x80 --ctmask 0x80
-A PREROUTING -i eth0 -j MARK --set-xmark 0x1/0xffffffff
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:AWS-SNAT-CHAIN-0 - [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80
-A POSTROUTING -m comment --comment "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-0
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A AWS-SNAT-CHAIN-0 -d 10.0.0.0/16 -m comment --comment "AWS SNAT CHAIN" -j RETURN
COMMIT
*filter
:FORWARD ACCEPT [0:0]
-A FORWARD -j AWS-SNAT-CHAIN-0
COMMIT
"""


def test_legacy_removal_is_one_restore_of_vpc_cnis_lines() -> None:
    script, removed = plan_legacy_removal(SAVE)
    assert script.splitlines() == [
        "*mangle",
        '-D PREROUTING -i eth0 -m comment --comment "AWS, primary ENI" -m addrtype --dst-type LOCAL'
        " --limit-iface-in -j CONNMARK --set-xmark 0x80/0x80",
        '-D PREROUTING -i eni+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark'
        " --nfmask 0x80 --ctmask 0x80",
        "COMMIT",
        "*nat",
        '-D PREROUTING -m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark --nfmask 0x80'
        " --ctmask 0x80",
        '-D POSTROUTING -m comment --comment "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-0',
        "-F AWS-SNAT-CHAIN-0",
        "-X AWS-SNAT-CHAIN-0",
        "COMMIT",
    ]
    assert len(removed) == 5


def test_a_legacy_save_without_vpc_cnis_lines_needs_no_restore() -> None:
    assert plan_legacy_removal("*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n") == ("", [])


def test_vpc_cnis_inbound_marks_stay_while_ipamd_marks_none() -> None:
    script, removed = plan_nft_removal("mangle", MANGLE, inbound=False)
    assert (script, removed) == ([], []), "NodePort keeps aws-node's mark: ipamd has none"
    assert plan_nft_removal("nat", NAT, inbound=False) == plan_nft_removal("nat", NAT)
    legacy, _ = plan_legacy_removal(SAVE, inbound=False)
    assert "*mangle" not in legacy and "AWS, primary ENI" not in legacy
    assert "-D POSTROUTING" in legacy and "AWS, CONNMARK" in legacy, "the nat side still goes"
