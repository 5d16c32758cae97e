"""An embedded EC2 world: moto with our extension, one VPC, subnet, security group and running instance,
and whatever extra subnets and VPC CIDR blocks a `Layout` asks for (`cloud.embedded.world_layout`).

For tests and `ipamd run --embedded`. `EmbeddedEc2` is the long-lived part (moto patched and started,
in this process or as a loopback HTTP server); each `EmbeddedEc2.world()` wipes moto's EC2 state and
builds a fresh `World` on it. `start_world()` does both for one-off use.

Why a long-lived host and a per-world reset (measured on this machine, moto 5.2.5, world = VPC +
subnet + security group + one instance, built through the API):

  fresh `mock_aws` per world (start, client, build, stop)           ~0.65 s
  loopback server, `POST /moto-api/reset`, build over HTTP           ~0.26 s
  one `mock_aws`, EC2 backend reset, build (in-process)              ~0.08 s
  ... the same, resetting without moto's bundled AMIs (what we do)     ~0.03 s in-process, ~0.04 s server

Skipping moto's bundled AMIs on reset is what makes a fresh world cheap. Tests use the in-process host
(~3 ms a call against ~7 ms over HTTP, and no port); `--embedded` uses the server, whose endpoint URL
other tools (the AWS CLI) can reach too. Both keep moto's state in this process, so the IMDS simulator
reads it directly (`World.backend()`). The server's WSGI app can be wrapped (`wrap_app`): that is
where a kept world is saved before each answer (`cloud.embedded.cloud_keeper`), and `wipe()` clears
moto for a world rebuilt from its file (`cloud.embedded.cloud_restore`).

Clients get dummy credentials explicitly and ignore the developer's AWS profile, config files and
endpoint overrides, so a test can never reach real AWS. Nothing is written to ~/.aws, and no
credentials to os.environ; the one environment write is moto's AMI switch, set only while a backend
is re-created (`_no_bundled_amis`).
"""

from __future__ import annotations

import ipaddress
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from types import TracebackType
from typing import Any, Final, Literal, Self

import boto3
import botocore.session
from botocore.config import Config
from moto import mock_aws
from moto.core.config import DefaultConfig
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from moto.ec2.models.instance_types import INSTANCE_TYPES
from moto.moto_api._internal import mock_random
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

from cloud.embedded import moto_ext
from cloud.embedded.world_layout import Layout, WorldSubnet, build_layout

Transport = Literal["in-process", "server"]
WsgiWrapper = Callable[[Any], Any]
"""Takes a WSGI application and returns one that calls it."""

ACCOUNT_ID: Final[str] = DEFAULT_ACCOUNT_ID
IMAGE_ID: Final = "ami-12c6146b"
"""An image ID from moto's bundled list (which our worlds do not load, see `_no_bundled_amis`)."""
CREDENTIALS: Final = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}

_MOCK_CONFIG: Final[DefaultConfig] = {
    "core": {
        # Leave os.environ alone: our clients carry their own dummy credentials.
        "mock_credentials": False,
        "passthrough": {"urls": [], "services": []},
        "reset_boto3_session": True,
        "service_whitelist": None,
    }
}

_ISOLATION: Final = {
    # A developer's ~/.aws and AWS_* settings must neither redirect nor reconfigure our clients.
    "config_file": os.devnull,
    "credentials_file": os.devnull,
    "profile": None,
    "ignore_configured_endpoint_urls": True,
    "use_fips_endpoint": False,
    "use_dualstack_endpoint": False,
    "defaults_mode": "legacy",
}

_NO_AMIS: Final = "MOTO_EC2_LOAD_DEFAULT_AMIS"
_env_lock = threading.Lock()

DEFAULT_CLIENT_CONFIG: Final = Config(
    retries={"mode": "standard", "total_max_attempts": 3}, connect_timeout=5, read_timeout=30
)


@dataclass(slots=True)
class World:
    """One VPC with the node's subnet, a security group and a running instance whose primary ENI is
    at device index 0 (DeleteOnTermination set, as RunInstances does); and the layout's extras."""

    region: str
    vpc_id: str
    subnet_id: str
    subnet_cidr: str
    availability_zone: str
    security_group_id: str
    instance_id: str
    instance_type: str
    primary_eni_id: str
    endpoint_url: str | None
    """The loopback server's URL; None in-process (clients talk to moto's in-process hook)."""
    secondary_cidrs: tuple[str, ...] = ()
    """The VPC's IPv4 CIDR blocks after its primary one."""
    subnets: tuple[WorldSubnet, ...] = ()
    """The VPC's subnets other than the node's, in the order they were made."""
    account_id: str = ACCOUNT_ID
    _on_close: Any = field(default=None, repr=False)

    def client(self, config: Config | None = None) -> Any:
        """A boto3 EC2 client for this world (dummy credentials). Default config: standard retries,
        3 attempts in all. Thread-safe; a client may be shared between threads."""
        return ec2_client(self.region, self.endpoint_url, config)

    def subnet(self, cidr: str) -> WorldSubnet:
        """The extra subnet with this CIDR (KeyError if the world has none)."""
        found = next((s for s in self.subnets if s.cidr == cidr), None)
        if found is None:
            raise KeyError(f"no extra subnet {cidr} in {[s.cidr for s in self.subnets]}")
        return found

    def backend(self) -> Any:
        """moto's EC2 backend holding this world (for the IMDS simulator and for assertions)."""
        return ec2_backends[self.account_id][self.region]

    def close(self) -> None:
        """Stop the host if this world owns it (`start_world`); otherwise nothing to do."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_client_lock = threading.Lock()


@cache
def _isolated_session() -> Any:
    core = botocore.session.Session()
    # Overrides in the config store win over instance variables, environment and files.
    store = core.get_component("config_store")
    for name, value in _ISOLATION.items():
        store.set_config_variable(name, value)
    return boto3.session.Session(botocore_session=core, **CREDENTIALS)


def ec2_client(region: str, endpoint_url: str | None = None, config: Config | None = None) -> Any:
    """A boto3 EC2 client with dummy credentials that reads no AWS config file, profile or endpoint
    override from the environment. All clients share one botocore session: loading EC2's service
    model costs ~0.5 s per session, and botocore sessions are not safe to share without a lock."""
    with _client_lock:
        return _isolated_session().client(
            "ec2",
            region_name=region,
            endpoint_url=endpoint_url,
            config=config or DEFAULT_CLIENT_CONFIG,
        )


class EmbeddedEc2:
    """moto's EC2 with our extension, running until `close()`; hands out fresh worlds."""

    def __init__(
        self, transport: Transport = "in-process", *, wrap_app: WsgiWrapper | None = None
    ) -> None:
        """`wrap_app` wraps the loopback server's WSGI app (server transport only): the hook that
        saves a kept world before each answer leaves (`cloud.embedded.cloud_keeper`)."""
        self.transport: Transport = transport
        self._mock: Any = None
        self._server: _LoopbackServer | None = None
        self._regions: set[str] = set()
        self._wrap_app = wrap_app

    @property
    def endpoint_url(self) -> str | None:
        return self._server.url if self._server is not None else None

    def start(self) -> Self:
        moto_ext.install()
        if self.transport == "in-process":
            self._mock = mock_aws(config=_MOCK_CONFIG)
            self._mock.start()
        else:
            self._server = _LoopbackServer(self._wrap_app)
            self._server.start()
        return self

    def reset(self) -> None:
        """Forget all EC2 state this host created (every region it built a world in)."""
        for region in sorted(self._regions):
            _fresh_backend(region)

    def wipe(self, region: str) -> None:
        """Forget all EC2 state, before a world is built in `region` (then wiped again on close)."""
        if self._mock is None and self._server is None:
            raise RuntimeError("EmbeddedEc2.start() first")
        self._regions.add(region)
        self.reset()

    def world(
        self,
        instance_type: str = "m5.large",
        region: str = "us-west-2",
        subnet_cidr: str = "10.0.0.0/16",
        *,
        seed: int | None = None,
        layout: Layout | None = None,
    ) -> World:
        """Reset EC2 state, then build a world. One world per host at a time: the next call wipes it.
        `seed` reseeds moto's process-wide random source, making IDs and address draws repeatable.
        `layout` adds VPC CIDR blocks and subnets (raises `LayoutError` before building if EC2 would
        refuse them); the node's subnet must then leave room for them in the VPC."""
        if instance_type not in INSTANCE_TYPES:
            raise ValueError(f"moto does not know instance type {instance_type!r}")
        subnet = ipaddress.IPv4Network(subnet_cidr)
        if not 16 <= subnet.prefixlen <= 28:
            raise ValueError(f"EC2 subnets are /16 to /28, not {subnet_cidr}")
        layout = layout or Layout()
        layout.check_against(subnet, _vpc_cidr(subnet))
        self.wipe(region)
        if seed is not None:
            mock_random.seed(seed)
        return _build(self.endpoint_url, instance_type, region, subnet, layout)

    def close(self) -> None:
        mock, self._mock = self._mock, None
        server, self._server = self._server, None
        if mock is not None:
            with _no_bundled_amis():
                mock.stop()  # wipes every moto backend, re-creating each once on the way
        if server is not None:
            self.reset()
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _fresh_backend(region: str) -> None:
    with _no_bundled_amis():
        ec2_backends[ACCOUNT_ID][region].reset()


@contextmanager
def _no_bundled_amis() -> Iterator[None]:
    """Re-create moto's EC2 backends without their ~1,300 bundled AMIs: a reset costs ~0.18 s with
    them, ~5 ms without. moto reads this switch from the environment when a backend is initialised,
    so it is set for exactly that moment. Worlds therefore list no images; RunInstances does not
    check the image ID (moto validates AMIs only when asked to)."""
    with _env_lock:
        previous = os.environ.get(_NO_AMIS)
        os.environ[_NO_AMIS] = "false"
        try:
            yield
        finally:
            if previous is None:
                del os.environ[_NO_AMIS]
            else:
                os.environ[_NO_AMIS] = previous


def start_world(
    instance_type: str = "m5.large",
    region: str = "us-west-2",
    subnet_cidr: str = "10.0.0.0/16",
    *,
    transport: Transport = "in-process",
    layout: Layout | None = None,
) -> World:
    """A world with a host of its own; `World.close()` (or leaving `with`) stops the host."""
    host = EmbeddedEc2(transport).start()
    try:
        world = host.world(instance_type, region, subnet_cidr, layout=layout)
    except BaseException:
        host.close()
        raise
    world._on_close = host.close
    return world


def _vpc_cidr(subnet: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """EC2 VPCs are /16 to /28: the node subnet's /16 holds it."""
    return subnet.supernet(new_prefix=16) if subnet.prefixlen > 16 else subnet


def _build(
    endpoint_url: str | None,
    instance_type: str,
    region: str,
    subnet: ipaddress.IPv4Network,
    layout: Layout,
) -> World:
    ec2 = ec2_client(region, endpoint_url)
    vpc_id: str = ec2.create_vpc(CidrBlock=str(_vpc_cidr(subnet)))["Vpc"]["VpcId"]
    zone = f"{region}a"
    subnet_id: str = ec2.create_subnet(VpcId=vpc_id, CidrBlock=str(subnet), AvailabilityZone=zone)[
        "Subnet"
    ]["SubnetId"]
    extras = build_layout(
        ec2, layout, vpc_id=vpc_id, node_subnet_id=subnet_id, region=region, node_zone=zone
    )
    group_id: str = ec2.create_security_group(
        GroupName="ipamd-node", Description="embedded node", VpcId=vpc_id
    )["GroupId"]
    reservation = ec2.run_instances(
        ImageId=IMAGE_ID,
        InstanceType=instance_type,
        MinCount=1,
        MaxCount=1,
        NetworkInterfaces=[
            {
                "DeviceIndex": 0,
                "SubnetId": subnet_id,
                "Groups": [group_id],
                "DeleteOnTermination": True,
            }
        ],
    )
    instance: dict[str, Any] = reservation["Instances"][0]
    return World(
        region=region,
        vpc_id=vpc_id,
        subnet_id=subnet_id,
        subnet_cidr=str(subnet),
        availability_zone=zone,
        security_group_id=group_id,
        instance_id=instance["InstanceId"],
        instance_type=instance_type,
        primary_eni_id=instance["NetworkInterfaces"][0]["NetworkInterfaceId"],
        endpoint_url=endpoint_url,
        secondary_cidrs=layout.secondary_cidrs,
        subnets=extras,
    )


class _QuietHandler(MotoRequestHandler):
    """moto's request handler without a log line per request (errors are still logged)."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return None


class _LoopbackServer:
    """moto's server app on 127.0.0.1 and a free port, served from a daemon thread of this process
    (what moto's ThreadedMotoServer does, minus its banner and request log)."""

    def __init__(self, wrap_app: WsgiWrapper | None = None) -> None:
        app: Any = DomainDispatcherApplication(create_backend_app)
        if wrap_app is not None:
            app = wrap_app(app)
        self._server: Any = make_server(
            "127.0.0.1", 0, app, threaded=True, request_handler=_QuietHandler
        )
        # serve_forever polls for shutdown every poll_interval (default 0.5 s, which close() pays).
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="embedded-ec2-server",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
