"""The subnet catalogue (`ipamd.pool.subnet_catalogue`): when it reads DescribeSubnets (first use, then on
the slow period, soon after a full subnet, never per ENI), what it answers with no view or after a
failed read, and custom networking's ENIConfig, which turns discovery off; how the parts wire it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cloud.fakes import FakeEc2, FakeEc2View, FakeImds
from cloud.ports import CallUrgency
from ipamd.clock import FakeClock
from ipamd.config.eniconfig import EniConfig
from ipamd.config.groups import SubnetSettings
from ipamd.config.settings import Config
from ipamd.node.engine_parts import Parts, describe_node, open_parts
from ipamd.pool.subnet_catalogue import SubnetCatalogue
from ipamd.runtime.fake import FakeRuntime
from ipamd.sizing.subnets import ROLE_TAG

HOUR_S = 3600.0


async def _catalogue(
    settings: SubnetSettings | None = None, eni_config: EniConfig | None = None
) -> tuple[SubnetCatalogue, FakeEc2, FakeClock, str]:
    clock = FakeClock()
    ec2 = FakeEc2(clock, subnet_cidr="10.0.0.0/24")
    pods = ec2.add_subnet("10.0.16.0/20", {ROLE_TAG: "1"})
    instance = await ec2.describe_instance(ec2.instance_id)
    catalogue = SubnetCatalogue(
        ec2, instance, settings or SubnetSettings(), clock, eni_config=eni_config, retry_s=60.0
    )
    return catalogue, ec2, clock, pods


async def test_the_first_use_reads_then_only_every_refresh_period() -> None:
    catalogue, ec2, clock, pods = await _catalogue()
    assert catalogue.candidates() == (ec2.subnet_id,), "before any read: the node's subnet"

    await catalogue.refresh_if_due()
    assert catalogue.candidates() == (pods, ec2.subnet_id)
    for _ in range(int(HOUR_S // 5) - 1):  # a pool tick every 5 s, the hour's last at 3595 s
        clock.advance(5.0)
        await catalogue.refresh_if_due()
        catalogue.candidates()
    # Read at 0 s and at 1800 s: two in the hour; the next is due at 3600 s, the next hour's first.
    assert ec2.calls["subnets_in"] == 2


async def test_failed_reads_in_a_row_are_retried_ever_later_up_to_the_refresh() -> None:
    """Thousands of nodes share the account's read budget: a node whose read was refused waits
    twice as long after each failure in a row (up to the refresh period), so its retries do not
    add to the load that refused them; a read that goes through starts over."""
    catalogue, ec2, clock, _ = await _catalogue(SubnetSettings(refresh_interval_s=1800.0))
    await catalogue.refresh_if_due()
    clock.advance(1800.0)

    async def next_read(fails: bool) -> float:
        """Seconds from now to the next read (in 10 s steps), which fails if `fails`."""
        if fails:
            ec2.fail_next("subnets_in", after_acting=False)
        reads, waited = catalogue.reads, 0.0
        await catalogue.refresh_if_due()
        while catalogue.reads == reads:
            clock.advance(10.0)
            waited += 10.0
            await catalogue.refresh_if_due()
        return waited

    assert await next_read(fails=True) == 0.0  # due now
    waits = [await next_read(fails=True) for _ in range(6)]
    assert waits == [60.0, 120.0, 240.0, 480.0, 960.0, 1800.0]
    assert catalogue.failures == 7
    assert await next_read(fails=False) == 1800.0
    assert await next_read(fails=True) == 1800.0, "the refresh period after a read"
    assert await next_read(fails=False) == 60.0, "the failures in a row start over"


async def test_a_full_subnet_brings_the_next_read_forward_but_not_before_retry_s() -> None:
    catalogue, ec2, clock, pods = await _catalogue()
    await catalogue.refresh_if_due()
    clock.advance(10.0)
    catalogue.full(pods)
    catalogue.full(pods)
    await catalogue.refresh_if_due()
    assert ec2.calls["subnets_in"] == 1, "not sooner than 60 s after the last read"
    clock.advance(50.0)
    await catalogue.refresh_if_due()
    assert ec2.calls["subnets_in"] == 2
    clock.advance(60.0)
    await catalogue.refresh_if_due()
    assert ec2.calls["subnets_in"] == 2, "then the slow period again"


async def test_a_failed_read_keeps_the_last_view_and_is_retried() -> None:
    catalogue, ec2, clock, pods = await _catalogue()
    await catalogue.refresh_if_due()
    ec2.tag_subnet(ec2.subnet_id, {ROLE_TAG: "0"})
    clock.advance(1800.0)
    ec2.fail_next("subnets_in", after_acting=False)

    assert not await catalogue.refresh_if_due()
    assert catalogue.failures == 1 and catalogue.candidates() == (pods, ec2.subnet_id)
    assert catalogue.closed == frozenset()
    clock.advance(59.0)
    await catalogue.refresh_if_due()
    assert catalogue.reads == 1 + 1, "the retry waits retry_s"
    clock.advance(1.0)
    assert await catalogue.refresh_if_due(), "the node's subnet is closed now"
    assert catalogue.candidates() == (pods,) and catalogue.closed == {ec2.subnet_id}


async def test_without_a_view_a_failed_first_read_leaves_the_nodes_subnet() -> None:
    catalogue, ec2, _, _ = await _catalogue()
    ec2.fail_next("subnets_in", after_acting=False)
    await catalogue.refresh_if_due()
    assert catalogue.candidates() == (ec2.subnet_id,) and catalogue.closed == frozenset()


async def test_discovery_off_reads_nothing_and_uses_the_nodes_subnet() -> None:
    catalogue, ec2, clock, _ = await _catalogue(SubnetSettings(discovery=False))
    ec2.tag_subnet(ec2.subnet_id, {ROLE_TAG: "0"})
    for _ in range(3):
        await catalogue.refresh_if_due()
        clock.advance(HOUR_S)
    assert ec2.calls["subnets_in"] == 0
    assert catalogue.candidates() == (ec2.subnet_id,) and catalogue.closed == frozenset()


async def test_an_eni_config_names_the_subnet_and_groups_and_turns_discovery_off() -> None:
    config = EniConfig("us-west-2a", "subnet-custom", ("sg-pods", "sg-extra"))
    catalogue, ec2, _, _ = await _catalogue(eni_config=config)
    await catalogue.refresh_if_due()
    assert ec2.calls["subnets_in"] == 0
    assert catalogue.candidates() == ("subnet-custom",)
    assert catalogue.security_groups == ("sg-pods", "sg-extra")

    bare, ec2, _, _ = await _catalogue(eni_config=EniConfig("z", "subnet-c"))
    assert bare.security_groups == ("sg-0fake",), "none named: the primary ENI's"


async def test_without_an_eni_config_new_enis_get_the_primary_enis_groups() -> None:
    catalogue, ec2, _, _ = await _catalogue()
    primary = next(e for e in ec2.enis.values() if e.device_index == 0)
    assert catalogue.security_groups == primary.groups == ("sg-0fake",)


class OnlyEc2Api:
    """An `Ec2Api` that serves no catalog call (as a test's wrapper around the adapter is)."""

    def __init__(self, inner: FakeEc2 | FakeEc2View) -> None:
        self._inner = inner

    def with_urgency(self, policy: CallUrgency) -> OnlyEc2Api:
        return OnlyEc2Api(self._inner.with_urgency(policy))

    def __getattr__(self, name: str) -> Any:
        if name == "subnets_in":
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_the_parts_wire_the_catalogue_from_the_configuration(tmp_path: Path) -> None:
    clock = FakeClock()
    ec2 = FakeEc2(clock)
    facts = await describe_node(ec2, ec2.instance_id)

    async def pool_of(env: dict[str, str], api: Any, **kw: Any) -> SubnetCatalogue:
        config = Config.from_env({"IPAMD_STATE_DIR": str(tmp_path / str(len(opened))), **env})
        parts = await open_parts(
            config,
            facts,
            ec2=api,
            imds=FakeImds(ec2),
            runtime=FakeRuntime(clock),
            clock=clock,
            **kw,
        )
        opened.append(parts)
        return parts.pool.subnets

    opened: list[Parts] = []
    assert (await pool_of({}, ec2)).discovering
    assert not (await pool_of({"ENABLE_SUBNET_DISCOVERY": "false"}, ec2)).discovering
    assert not (await pool_of({}, OnlyEc2Api(ec2))).discovering, "no catalog: the node's subnet"
    assert (await pool_of({}, OnlyEc2Api(ec2), subnets=ec2)).discovering
    custom = await pool_of({}, ec2, eni_config=EniConfig("us-west-2a", "subnet-c", ("sg-1",)))
    assert not custom.discovering and custom.candidates() == ("subnet-c",)

    catalogue = await pool_of({"IPAMD_SUBNET_REFRESH_INTERVAL": "10m"}, ec2)
    await opened[-1].pool.run_once()
    clock.advance(599.0)
    await opened[-1].pool.run_once()
    assert catalogue.reads == 1
    clock.advance(1.0)
    await opened[-1].pool.run_once()
    assert catalogue.reads == 2
    for parts in opened:
        await parts.engine.close()


async def test_a_followed_eniconfig_is_the_next_enis_and_its_problem_is_kept() -> None:
    start = EniConfig("pods-a", "subnet-0aaaaaaaaaaaaaaa1")
    catalogue, ec2, _, pods = await _catalogue(eni_config=start)
    primary = (await ec2.describe_instance(ec2.instance_id)).security_groups
    assert catalogue.candidates() == ("subnet-0aaaaaaaaaaaaaaa1",)
    assert catalogue.security_groups == primary, "none named: the primary ENI's"

    catalogue.follow_eni_config(EniConfig("pods-b", pods, ("sg-0123456789abcdef0",)))
    assert catalogue.candidates() == (pods,)
    assert catalogue.security_groups == ("sg-0123456789abcdef0",)
    assert catalogue.eni_config_problem == ""

    catalogue.follow_eni_config(catalogue.eni_config or start, "ENIConfig 'pods-c' does not exist")
    assert catalogue.candidates() == (pods,), "the last good one stays"
    assert catalogue.eni_config_problem == "ENIConfig 'pods-c' does not exist"


async def test_without_custom_networking_an_eniconfig_changes_nothing() -> None:
    catalogue, ec2, _, _ = await _catalogue()
    catalogue.follow_eni_config(EniConfig("pods-b", "subnet-0bbbbbbbbbbbbbbb2"), "a problem")
    assert catalogue.eni_config is None
    assert catalogue.eni_config_problem == ""
    assert catalogue.candidates() == (ec2.subnet_id,)
