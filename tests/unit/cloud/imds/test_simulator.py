"""The IMDS simulator: IMDSv2's token rules and paths served from moto's live state, and the staleness
knobs that reproduce IMDS lagging EC2 in both directions (per address, by time, frozen), down to the
shape of the incident where IMDS's count matched while its contents did not."""

from __future__ import annotations

import random
from typing import Any

import aiohttp

from cloud.calls import CallLog
from cloud.embedded.imds_sim import ImdsSimulator
from cloud.embedded.world import EmbeddedEc2, World
from cloud.embedded.world_layout import Layout
from cloud.imds import Imdsv2Client
from cloud.ports import ImdsInterface
from tests.unit.cloud.imds.conftest import (
    FakeTime,
    assign_ips,
    assign_prefixes,
    attach_eni,
    ec2_enis,
    unassign,
)

TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"


async def _put_token(sim: ImdsSimulator, headers: dict[str, str]) -> tuple[int, str, str | None]:
    async with (
        aiohttp.ClientSession() as session,
        session.put(sim.base_url + "/latest/api/token", headers=headers) as answer,
    ):
        return answer.status, await answer.text(), answer.headers.get(TTL)


async def _get(sim: ImdsSimulator, path: str, token: str | None) -> tuple[int, str]:
    headers = {TOKEN: token} if token is not None else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(sim.base_url + "/latest/meta-data/" + path, headers=headers) as answer,
    ):
        return answer.status, await answer.text()


async def _token(sim: ImdsSimulator, ttl_s: int = 21600) -> str:
    status, token, _ = await _put_token(sim, {TTL: str(ttl_s)})
    assert status == 200
    return token


def _primary(sim: ImdsSimulator) -> ImdsInterface:
    return sim.view()[0]


def _secondaries(eni: ImdsInterface) -> set[str]:
    return set(eni.local_ipv4s[1:])


# -- IMDSv2 -----------------------------------------------------------------------------------


async def test_a_token_needs_a_ttl_of_1_to_21600_seconds(sim: ImdsSimulator) -> None:
    assert (await _put_token(sim, {}))[0] == 400
    for bad in ("", "0", "21601", "-5", "abc", "1.5", "\u00b2"):
        assert (await _put_token(sim, {TTL: bad}))[0] == 400, bad
    for good in ("1", "21600"):
        assert (await _put_token(sim, {TTL: good}))[0] == 200, good


async def test_a_token_echoes_its_ttl(sim: ImdsSimulator) -> None:
    status, token, ttl = await _put_token(sim, {TTL: "21600"})
    assert status == 200 and token and ttl == "21600"


async def test_a_proxied_token_request_is_forbidden(sim: ImdsSimulator) -> None:
    status, _, _ = await _put_token(sim, {TTL: "60", "X-Forwarded-For": "203.0.113.9"})
    assert status == 403


async def test_reads_need_a_valid_unexpired_token(
    sim: ImdsSimulator, world: World, fake_time: FakeTime
) -> None:
    assert (await _get(sim, "instance-id", None))[0] == 401
    assert (await _get(sim, "instance-id", "not-a-token"))[0] == 401
    token = await _token(sim, ttl_s=60)
    assert await _get(sim, "instance-id", token) == (200, world.instance_id)
    fake_time.advance(59.9)
    assert (await _get(sim, "instance-id", token))[0] == 200
    fake_time.advance(0.1)
    assert (await _get(sim, "instance-id", token))[0] == 401
    fresh = await _token(sim)
    sim.revoke_tokens()
    assert (await _get(sim, "instance-id", fresh))[0] == 401


async def test_paths_are_served_from_ec2(sim: ImdsSimulator, world: World, ec2: Any) -> None:
    token = await _token(sim)
    assign_ips(ec2, world.primary_eni_id, 4)
    second = attach_eni(ec2, world, 1)
    enis = ec2_enis(ec2, world)
    status, macs = await _get(sim, "network/interfaces/macs/", token)
    assert status == 200
    lines = macs.split("\n")
    assert len(lines) == 2 and all(line.endswith("/") for line in lines)
    mac = lines[0].rstrip("/")
    assert await _get(sim, f"network/interfaces/macs/{mac}/interface-id", token) == (
        200,
        world.primary_eni_id,
    )
    assert (await _get(sim, f"network/interfaces/macs/{mac}/device-number", token))[1] == "0"
    assert (await _get(sim, f"network/interfaces/macs/{mac}/subnet-id", token))[
        1
    ] == world.subnet_id
    ips = (await _get(sim, f"network/interfaces/macs/{mac}/local-ipv4s", token))[1].split("\n")
    primary, every, _ = enis[world.primary_eni_id]
    assert ips[0] == primary and set(ips) == every and len(ips) == 5
    second_mac = lines[1].rstrip("/")
    assert (await _get(sim, f"network/interfaces/macs/{second_mac}/interface-id", token))[
        1
    ] == second
    assert (await _get(sim, "placement/region", token))[1] == world.region
    assert (await _get(sim, "placement/availability-zone", token))[1] == world.availability_zone
    assert (await _get(sim, "instance-type", token))[1] == world.instance_type


async def test_prefixes_are_listed_and_404_when_there_are_none(
    sim: ImdsSimulator, world: World, ec2: Any
) -> None:
    token = await _token(sim)
    mac = _primary(sim).mac
    path = f"network/interfaces/macs/{mac}/ipv4-prefix"
    assert (await _get(sim, path, token))[0] == 404
    prefixes = assign_prefixes(ec2, world.primary_eni_id, 2)
    status, body = await _get(sim, path, token)
    assert status == 200 and set(body.split("\n")) == set(prefixes)


async def test_ipv6_prefixes_are_listed_and_404_when_there_are_none(
    embedded: EmbeddedEc2, fake_time: FakeTime
) -> None:
    """IMDS serves an ENI's delegated IPv6 prefixes at `ipv6-prefix`, as it does /28s at
    `ipv4-prefix` (VPC CNI reads both there)."""
    world = embedded.world(seed=17, layout=Layout(ipv6=True))
    ec2 = world.client()
    async with ImdsSimulator(world, clock=fake_time.clock, rng=random.Random(3)) as sim:
        token = await _token(sim)
        path = f"network/interfaces/macs/{_primary(sim).mac}/ipv6-prefix"
        assert (await _get(sim, path, token))[0] == 404
        answer = ec2.assign_ipv6_addresses(
            NetworkInterfaceId=world.primary_eni_id, Ipv6PrefixCount=1
        )
        assert await _get(sim, path, token) == (200, answer["AssignedIpv6Prefixes"][0])
        listed = (await _get(sim, path.removesuffix("ipv6-prefix"), token))[1].split("\n")
        assert "ipv6-prefix" in listed and "ipv4-prefix" in listed


async def test_unknown_paths_and_macs_are_404(sim: ImdsSimulator) -> None:
    token = await _token(sim)
    assert (await _get(sim, "no-such-thing", token))[0] == 404
    assert (await _get(sim, "network/interfaces/macs/02:00:00:00:00:99/mac", token))[0] == 404
    assert (await _get(sim, f"network/interfaces/macs/{_primary(sim).mac}/nope", token))[0] == 404


async def test_faults_are_served_before_the_token_check(sim: ImdsSimulator) -> None:
    sim.faults.fail_next(2, 500)
    assert (await _put_token(sim, {TTL: "60"}))[0] == 500
    assert (await _get(sim, "instance-id", None))[0] == 500
    token = await _token(sim)
    sim.faults.not_found("*/instance-type")
    assert (await _get(sim, "instance-type", token))[0] == 404
    assert (await _get(sim, "instance-id", token))[0] == 200
    sim.faults.clear()
    assert (await _get(sim, "instance-type", token))[0] == 200
    assert sim.count("PUT", 500) == 1 and sim.count("GET", 404) == 1


# -- staleness: per address ---------------------------------------------------------------------


async def test_keep_serves_released_addresses_and_prefixes(
    sim: ImdsSimulator, world: World, ec2: Any
) -> None:
    ips = assign_ips(ec2, world.primary_eni_id, 3)
    (prefix,) = assign_prefixes(ec2, world.primary_eni_id, 1)
    sim.lag.keep(ips[0], prefix)
    unassign(ec2, world.primary_eni_id, ips=ips, prefixes=[prefix])
    eni = _primary(sim)
    assert _secondaries(eni) == {ips[0]} and eni.ipv4_prefixes == (prefix,)
    assert ips[0] not in ec2_enis(ec2, world)[world.primary_eni_id][1]
    sim.lag.release(ips[0], prefix)
    eni = _primary(sim)
    assert _secondaries(eni) == set() and eni.ipv4_prefixes == ()


async def test_hide_misses_new_addresses_until_released(
    sim: ImdsSimulator, world: World, ec2: Any
) -> None:
    ips = assign_ips(ec2, world.primary_eni_id, 3)
    (prefix,) = assign_prefixes(ec2, world.primary_eni_id, 1)
    sim.lag.hide(ips[1], ips[2], prefix)
    eni = _primary(sim)
    assert _secondaries(eni) == {ips[0]} and eni.ipv4_prefixes == ()
    sim.lag.hide(eni.local_ipv4s[0])  # a primary address is never hidden
    assert _primary(sim).local_ipv4s[0] == eni.local_ipv4s[0]
    sim.lag.release(ips[1], ips[2], prefix)
    eni = _primary(sim)
    assert _secondaries(eni) == set(ips) and eni.ipv4_prefixes == (prefix,)


# -- staleness: by time --------------------------------------------------------------------------


async def test_new_addresses_appear_add_lag_after_they_were_observed(
    sim: ImdsSimulator, world: World, ec2: Any, fake_time: FakeTime
) -> None:
    before = assign_ips(ec2, world.primary_eni_id, 1)
    sim.observe()
    sim.lag.add_lag_s = 60.0
    fake_time.advance(60)
    new = assign_ips(ec2, world.primary_eni_id, 2)
    (prefix,) = assign_prefixes(ec2, world.primary_eni_id, 1)
    sim.observe()
    seen = sim.lag.sighting(new[0])
    assert seen is not None and seen.first_seen == fake_time.now and seen.gone_since is None
    fake_time.advance(59)
    eni = _primary(sim)
    assert _secondaries(eni) == set(before) and eni.ipv4_prefixes == ()
    assert seen.last_seen == fake_time.now
    fake_time.advance(1)
    eni = _primary(sim)
    assert _secondaries(eni) == {*before, *new} and eni.ipv4_prefixes == (prefix,)


async def test_addresses_present_at_start_and_primaries_do_not_lag(
    world: World, ec2: Any, fake_time: FakeTime
) -> None:
    early = assign_ips(ec2, world.primary_eni_id, 2)
    async with ImdsSimulator(world, clock=fake_time.clock) as sim:
        sim.lag.add_lag_s = 3600.0
        second = attach_eni(ec2, world, 1)
        first, attached = sim.view()
        assert _secondaries(first) == set(early)
        assert attached.eni_id == second and len(attached.local_ipv4s) == 1


async def test_released_addresses_linger_remove_lag_after_observed_gone(
    sim: ImdsSimulator, world: World, ec2: Any, fake_time: FakeTime
) -> None:
    ips = assign_ips(ec2, world.primary_eni_id, 3)
    sim.lag.remove_lag_s = 30.0
    sim.observe()
    fake_time.advance(5)
    unassign(ec2, world.primary_eni_id, ips=ips[:2])
    sim.observe()
    seen = sim.lag.sighting(ips[0])
    assert seen is not None and seen.gone_since == fake_time.now
    assert seen.last_seen == fake_time.now - 5
    fake_time.advance(29.5)
    assert _secondaries(_primary(sim)) == set(ips)
    fake_time.advance(0.5)
    assert _secondaries(_primary(sim)) == {ips[2]}
    assert sim.lag.sighting(ips[0]) is None  # forgotten once no longer served


async def test_release_ends_a_time_lag_early(
    sim: ImdsSimulator, world: World, ec2: Any, fake_time: FakeTime
) -> None:
    sim.lag.add_lag_s = sim.lag.remove_lag_s = 600.0
    old = assign_ips(ec2, world.primary_eni_id, 1)
    sim.observe()
    assert _secondaries(_primary(sim)) == set()
    sim.lag.release(*old)
    assert _secondaries(_primary(sim)) == set(old)
    unassign(ec2, world.primary_eni_id, ips=old)
    new = assign_ips(ec2, world.primary_eni_id, 1)
    sim.observe()
    assert _secondaries(_primary(sim)) == set(old)  # a new lag for each change
    sim.lag.release(*old, *new)
    assert _secondaries(_primary(sim)) == set(new)


# -- staleness: frozen --------------------------------------------------------------------------


async def test_a_frozen_snapshot_is_served_until_thawed(
    sim: ImdsSimulator, world: World, ec2: Any, fake_time: FakeTime
) -> None:
    ips = assign_ips(ec2, world.primary_eni_id, 2)
    sim.lag.freeze()
    frozen = sim.view()
    unassign(ec2, world.primary_eni_id, ips=ips[:1])
    assign_ips(ec2, world.primary_eni_id, 3)
    assign_prefixes(ec2, world.primary_eni_id, 1)
    attach_eni(ec2, world, 1)
    fake_time.advance(7200)
    assert sim.view() == frozen and _secondaries(frozen[0]) == set(ips)
    sim.lag.thaw()
    thawed = sim.view()
    assert {
        e.eni_id: (e.local_ipv4s[0], set(e.local_ipv4s), set(e.ipv4_prefixes)) for e in thawed
    } == {k: (p, set(a), set(x)) for k, (p, a, x) in ec2_enis(ec2, world).items()}


async def test_clear_turns_every_knob_off(
    sim: ImdsSimulator, world: World, ec2: Any, fake_time: FakeTime
) -> None:
    kept, hidden = assign_ips(ec2, world.primary_eni_id, 2)
    sim.lag.keep(kept)
    sim.lag.hide(hidden)
    sim.lag.add_lag_s = 100.0
    lagging = assign_ips(ec2, world.primary_eni_id, 1)
    unassign(ec2, world.primary_eni_id, ips=[kept])
    sim.lag.freeze()
    sim.lag.clear()
    assert _secondaries(_primary(sim)) == {hidden, *lagging}


# -- the incident's shape ------------------------------------------------------------------------


def _seed_001_setup(ec2: Any, world: World, sim: ImdsSimulator) -> tuple[list[str], list[str]]:
    """M addresses everyone agrees on, and 4 more that ipamd will release: returns (common, old)."""
    common = assign_ips(ec2, world.primary_eni_id, 5)
    old = assign_ips(ec2, world.primary_eni_id, 4)
    sim.observe()
    sim.lag.release(*common, *old)  # IMDS has long agreed on these
    return common, old


async def _both_views(
    imds: Imdsv2Client, ec2: Any, world: World
) -> tuple[frozenset[str], frozenset[str]]:
    (eni,) = await imds.interfaces()
    return frozenset(eni.local_ipv4s), ec2_enis(ec2, world)[world.primary_eni_id][1]


async def test_seed_001_counts_match_while_contents_differ(
    imds: Imdsv2Client, sim: ImdsSimulator, world: World, ec2: Any
) -> None:
    common, old = _seed_001_setup(ec2, world, sim)
    sim.lag.keep(*old)  # released by ipamd, still in IMDS for hours
    unassign(ec2, world.primary_eni_id, ips=old)
    new = assign_ips(ec2, world.primary_eni_id, 3)
    sim.lag.hide(*new)  # newly assigned, missing from IMDS for hours
    in_imds, in_ec2 = await _both_views(imds, ec2, world)
    assert len(in_imds) == len(in_ec2) + 1  # M+4 against M+3: a count check falls back to EC2
    new += assign_ips(ec2, world.primary_eni_id, 1)  # the warm pool grows by one
    sim.lag.hide(new[-1])
    in_imds, in_ec2 = await _both_views(imds, ec2, world)
    assert len(in_imds) == len(in_ec2) == 1 + 5 + 4  # the worst moment: the counts agree...
    assert in_imds - in_ec2 == set(old) and in_ec2 - in_imds == set(new)  # ...the contents do not
    assert set(common) <= in_imds & in_ec2
    sim.lag.release(*old, *new)
    assert await _both_views(imds, ec2, world) == (in_ec2, in_ec2)


async def test_seed_001_by_time_lag_then_imds_catches_up(
    sim: ImdsSimulator, world: World, ec2: Any, fake_time: FakeTime, calls: CallLog
) -> None:
    common, old = _seed_001_setup(ec2, world, sim)
    sim.lag.add_lag_s = sim.lag.remove_lag_s = 3 * 3600.0  # "for several hours"
    unassign(ec2, world.primary_eni_id, ips=old)
    new = assign_ips(ec2, world.primary_eni_id, 3)
    sim.observe()
    fake_time.advance(60)
    new += assign_ips(ec2, world.primary_eni_id, 1)
    sim.observe()
    async with Imdsv2Client(sim.base_url, recorder=calls, clock=fake_time.clock) as imds:
        in_imds, in_ec2 = await _both_views(imds, ec2, world)
        assert len(in_imds) == len(in_ec2)
        assert in_imds - in_ec2 == set(old) and in_ec2 - in_imds == set(new)
        fake_time.advance(3 * 3600.0 - 60)  # the first 3 new ones and the 4 old ones caught up
        in_imds, in_ec2 = await _both_views(imds, ec2, world)
        assert in_ec2 - in_imds == {new[-1]} and in_imds - in_ec2 == set()
        fake_time.advance(60)
        in_imds, in_ec2 = await _both_views(imds, ec2, world)
        assert in_imds == in_ec2 and set(common) <= in_ec2
