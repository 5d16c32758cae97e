"""`MotoEc2Client`: the part of a boto3 EC2 client that `cloud.ec2.Boto3Ec2` calls, answered in-process
by moto's EC2 backend (with ipamd's moto extension installed), behind the account's `AccountFront`.

Why not a boto3 client on `mock_aws`: serialising every request through botocore and moto's response
layer costs milliseconds a call; calling the backend's models directly costs microseconds, and the
node side (`Boto3Ec2`: retries, client-side buckets, error translation, recording) is still the real
adapter, fed the same dictionaries and the same botocore `ClientError`s a real client would give it.
The requests follow what `cloud.embedded.moto_handlers` does with them (the same backend calls and
`cloud.embedded.eni_rules` rules); lookups go straight to the backend's dictionaries and indexes
(`cloud.embedded.moto_index`) rather than through moto's linear scans. Only the parameters ipamd
sends are read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import ClientError
from moto.core.exceptions import ServiceException
from moto.ec2.models.instance_types import INSTANCE_TYPES

from bench.cluster.front import OK, THROTTLED, AccountFront
from cloud.embedded import eni_rules, moto_index

Response = dict[str, Any]


class _SimulatedClientError(ClientError):  # type: ignore[misc]  # botocore ships no types
    """botocore's `ClientError` with the same `response` and `operation_name`, built without the
    message formatting and retry-info parsing botocore does: the simulated account refuses tens of
    thousands of requests a run, and the adapter reads only `response`."""

    def __init__(self, body: Any, operation: str) -> None:
        Exception.__init__(self, f"{operation}: {body['Error']['Code']}")
        self.response = body
        self.operation_name = operation


def _client_error(operation: str, code: str, message: str) -> ClientError:
    body: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": 503 if code == THROTTLED else 400},
    }
    return _SimulatedClientError(body, operation)


def _moto_error(exc: Exception) -> tuple[str, str] | None:
    """(code, message) of an error moto raised as EC2 would answer it; None for anything else."""
    if isinstance(exc, ServiceException):
        return str(exc.code), str(exc.message)
    error_type = getattr(exc, "error_type", None)
    if error_type is not None:
        return str(error_type), str(getattr(exc, "message", ""))
    return None


def eni_answer(backend: Any, eni: Any) -> Response:
    """One ENI as DescribeNetworkInterfaces shows it."""
    answer: Response = {
        "NetworkInterfaceId": eni.id,
        "SubnetId": eni.subnet.id,
        "Status": eni.status,
        "MacAddress": eni.mac_address,
        "PrivateIpAddress": eni.private_ip_address,
        "PrivateIpAddresses": [
            {"PrivateIpAddress": e["PrivateIpAddress"], "Primary": bool(e.get("Primary"))}
            for e in eni.private_ip_addresses
        ],
        "Ipv4Prefixes": [{"Ipv4Prefix": p} for p in eni_rules.eni_prefixes(eni)],
        "TagSet": [{"Key": k, "Value": v} for k, v in backend.tags.get(eni.id, {}).items()],
        "InterfaceType": eni.interface_type,
    }
    if eni.instance is not None and eni.attachment_id is not None:
        answer["Attachment"] = {
            "AttachmentId": eni.attachment_id,
            "DeviceIndex": eni.device_index,
            "InstanceId": eni.instance.id,
            "DeleteOnTermination": bool(eni.delete_on_termination),
            "Status": "attached",
        }
    return answer


class MotoEc2Client:
    """The EC2 client surface `Boto3Ec2` uses, for every node of the account (module docstring)."""

    def __init__(self, front: AccountFront, backend: Any, instances: Mapping[str, Any]) -> None:
        self._front = front
        self._backend = backend
        self._instances = instances
        """Running instances by ID (moto's own lookup scans every reservation)."""
        self._tokens: dict[str, str] = {}
        """CreateNetworkInterface ClientToken -> the ENI it created (EC2's idempotency)."""

    def _serve(self, operation: str, handle: Callable[[], Response]) -> Response:
        if not self._front.admit(operation):
            raise _client_error(operation, THROTTLED, "Request limit exceeded.")
        try:
            answer = handle()
        except Exception as exc:
            error = _moto_error(exc)
            if error is None:
                raise
            self._front.record(operation, error[0])
            raise _client_error(operation, *error) from exc
        self._front.record(operation, OK)
        return answer

    def _eni(self, eni_id: str) -> Any:
        eni = self._backend.enis.get(eni_id)
        if eni is None:
            raise eni_rules.ec2_error(
                "InvalidNetworkInterfaceID.NotFound",
                f"The networkInterface ID '{eni_id}' does not exist",
            )
        return eni

    # -- reads ---------------------------------------------------------------------------------

    def describe_network_interfaces(self, **params: Any) -> Response:
        return self._serve("DescribeNetworkInterfaces", lambda: self._describe_enis(params))

    def _describe_enis(self, params: Mapping[str, Any]) -> Response:
        if params.get("NetworkInterfaceIds"):
            enis = [self._eni(i) for i in params["NetworkInterfaceIds"]]
        else:
            enis = self._filtered(params.get("Filters") or [])
        return {"NetworkInterfaces": [eni_answer(self._backend, e) for e in enis]}

    def _filtered(self, filters: list[Mapping[str, Any]]) -> list[Any]:
        wanted = {str(f["Name"]): set(f["Values"]) for f in filters}
        statuses = wanted.pop("status", None)
        instance_ids = wanted.pop("attachment.instance-id", None)
        if instance_ids is not None:
            candidates = [
                nic
                for i in instance_ids
                if (instance := self._instances.get(i)) is not None
                for nic in instance.nics.values()
            ]
        elif statuses is not None and statuses <= {moto_index.AVAILABLE}:
            candidates = moto_index.available_enis(self._backend)
        else:
            candidates = list(self._backend.enis.values())
        tags = {name.removeprefix("tag:"): values for name, values in wanted.items()}
        return [
            e
            for e in candidates
            if self._tagged(e.id, tags) and (statuses is None or e.status in statuses)
        ]

    def _tagged(self, eni_id: str, tags: Mapping[str, set[str]]) -> bool:
        held: Mapping[str, str] = self._backend.tags.get(eni_id, {})
        return all(held.get(key) in values for key, values in tags.items())

    def describe_instances(self, **params: Any) -> Response:
        return self._serve("DescribeInstances", lambda: self._describe_instances(params))

    def _describe_instances(self, params: Mapping[str, Any]) -> Response:
        found = [
            self._instances[i] for i in params.get("InstanceIds") or [] if i in self._instances
        ]
        return {"Reservations": [{"Instances": [self._instance_answer(i) for i in found]}]}

    def _instance_answer(self, instance: Any) -> Response:
        return {
            "InstanceId": instance.id,
            "InstanceType": instance.instance_type,
            "SubnetId": instance.subnet_id,
            "VpcId": self._backend.get_subnet(instance.subnet_id).vpc_id,
            "PrivateIpAddress": instance.private_ip,
            "Placement": {"AvailabilityZone": instance.placement.zone or ""},
            "NetworkInterfaces": [
                {
                    "Attachment": {"DeviceIndex": index},
                    "Groups": [{"GroupId": g.id} for g in nic.group_set],
                }
                for index, nic in instance.nics.items()
            ],
        }

    def describe_instance_types(self, **params: Any) -> Response:
        def answer() -> Response:
            types = [
                INSTANCE_TYPES[t] for t in params.get("InstanceTypes") or [] if t in INSTANCE_TYPES
            ]
            return {"InstanceTypes": types}

        return self._serve("DescribeInstanceTypes", answer)

    def describe_subnets(self, **params: Any) -> Response:
        def answer() -> Response:
            subnets = self._subnets(params)
            return {
                "Subnets": [
                    {
                        "SubnetId": s.id,
                        "CidrBlock": s.cidr_block,
                        "AvailableIpAddressCount": s.available_ip_address_count,
                        "VpcId": s.vpc_id,
                        "AvailabilityZone": s.availability_zone,
                        "Tags": [
                            {"Key": k, "Value": v}
                            for k, v in self._backend.tags.get(s.id, {}).items()
                        ],
                    }
                    for s in subnets
                ]
            }

        return self._serve("DescribeSubnets", answer)

    def _subnets(self, params: Mapping[str, Any]) -> list[Any]:
        """What moto's `describe_subnets` finds, in its order (zone by zone), for one subnet ID or
        the vpc-id and availability-zone filters subnet discovery sends, without moto's copy and
        filter of every subnet of the account; anything else goes to moto."""
        ids: list[str] = list(params.get("SubnetIds") or [])
        wanted = {str(f["Name"]): list(f["Values"]) for f in params.get("Filters") or []}
        if len(ids) == 1 and not wanted:
            return [self._backend.get_subnet(ids[0])]
        if ids or not wanted or not set(wanted) <= {"vpc-id", "availability-zone"}:
            return list(self._backend.describe_subnets(ids or None, wanted))
        zones: dict[str, dict[str, Any]] = self._backend.subnets
        if "availability-zone" in wanted:
            zones = {z: zones[z] for z in zones if z in wanted["availability-zone"]}
        vpcs = wanted.get("vpc-id")
        return [
            s
            for in_zone in zones.values()
            for s in in_zone.values()
            if s.availability_zone in wanted.get("availability-zone", [s.availability_zone])
            and (vpcs is None or s.vpc_id in vpcs)
        ]

    # -- ENIs ----------------------------------------------------------------------------------

    def create_network_interface(self, **params: Any) -> Response:
        return self._serve("CreateNetworkInterface", lambda: self._create(params))

    def _create(self, params: Mapping[str, Any]) -> Response:
        token = params.get("ClientToken")
        if token and token in self._tokens and self._tokens[token] in self._backend.enis:
            return {"NetworkInterface": eni_answer(self._backend, self._eni(self._tokens[token]))}
        specs = params.get("TagSpecifications") or [{}]
        tags = {t["Key"]: t["Value"] for t in specs[0].get("Tags", [])}
        eni = self._backend.create_network_interface(
            self._backend.get_subnet(params["SubnetId"]),
            None,
            [],
            list(params.get("Groups") or []),
            params.get("Description"),
            tags,
            secondary_ips_count=int(params.get("SecondaryPrivateIpAddressCount") or 0),
            ipv4_prefix_count=int(params.get("Ipv4PrefixCount") or 0),
        )
        if token:
            self._tokens[token] = eni.id
        return {"NetworkInterface": eni_answer(self._backend, eni)}

    def attach_network_interface(self, **params: Any) -> Response:
        def answer() -> Response:
            attachment = self._backend.attach_network_interface(
                params["NetworkInterfaceId"], params["InstanceId"], int(params["DeviceIndex"])
            )
            return {"AttachmentId": attachment.attachment_id}

        return self._serve("AttachNetworkInterface", answer)

    def modify_network_interface_attribute(self, **params: Any) -> Response:
        def answer() -> Response:
            eni = self._eni(params["NetworkInterfaceId"])
            attachment = params.get("Attachment") or {}
            attachment_id = attachment.get("AttachmentId")
            if attachment_id is None or attachment_id != eni.attachment_id:
                raise eni_rules.ec2_error(
                    "InvalidAttachmentID.NotFound",
                    f"The attachment ID '{attachment_id}' does not exist",
                )
            if attachment.get("DeleteOnTermination") is not None:
                eni.delete_on_termination = bool(attachment["DeleteOnTermination"])
            return {}

        return self._serve("ModifyNetworkInterfaceAttribute", answer)

    def detach_network_interface(self, **params: Any) -> Response:
        def answer() -> Response:
            self._backend.detach_network_interface(params["AttachmentId"])
            return {}

        return self._serve("DetachNetworkInterface", answer)

    def delete_network_interface(self, **params: Any) -> Response:
        def answer() -> Response:
            eni = self._eni(params["NetworkInterfaceId"])
            if eni.attachment_id is not None:
                raise eni_rules.ec2_error(
                    "InvalidNetworkInterface.InUse", f"Network interface '{eni.id}' is in use."
                )
            self._backend.delete_network_interface(eni.id)
            return {}

        return self._serve("DeleteNetworkInterface", answer)

    def assign_private_ip_addresses(self, **params: Any) -> Response:
        def answer() -> Response:
            eni = self._eni(params["NetworkInterfaceId"])
            done = eni_rules.assign(
                eni,
                count=int(params.get("SecondaryPrivateIpAddressCount") or 0),
                prefix_count=int(params.get("Ipv4PrefixCount") or 0),
            )
            return {
                "NetworkInterfaceId": eni.id,
                "AssignedPrivateIpAddresses": [{"PrivateIpAddress": a} for a in done.addresses],
                "AssignedIpv4Prefixes": [{"Ipv4Prefix": p} for p in done.prefixes],
            }

        return self._serve("AssignPrivateIpAddresses", answer)

    def unassign_private_ip_addresses(self, **params: Any) -> Response:
        def answer() -> Response:
            eni = self._eni(params["NetworkInterfaceId"])
            eni_rules.unassign(
                eni, params.get("PrivateIpAddresses") or [], params.get("Ipv4Prefixes") or []
            )
            return {}

        return self._serve("UnassignPrivateIpAddresses", answer)


def run_instance(
    backend: Any, region: str, image_id: str, instance_type: str, subnet_id: str, group_id: str
) -> Any:
    """Launch one instance whose primary ENI is in `subnet_id` and `group_id`, with
    DeleteOnTermination: RunInstances with those NetworkInterfaces, handed to moto's backend as its
    response handler hands it (moto 5.2.5, `EC2Response.run_instances`) but with no request to parse
    and no answer to serialise. Returns moto's instance.

    Two of moto's steps cost time that grows with the instances already launched, and nothing here
    reads what they make, so they are left out: the root volume (an empty `block_device_mappings`;
    attaching it looks the new instance up by scanning copies of every reservation) and the
    check of the instance type against every offering (`is_instance_type_default`; moto checks
    without enforcing unless told to). At 5,000 nodes they took most of the launch's time."""
    nic = {
        "DeviceIndex": 0,
        "SubnetId": subnet_id,
        "Groups": [group_id],
        "DeleteOnTermination": True,
    }
    params: dict[str, Any] = {
        "instance_type": instance_type,
        "is_instance_type_default": True,
        "block_device_mappings": [],
        "placement": None,
        "placement_hostid": None,
        "region_name": region,
        "subnet_id": None,
        "key_name": None,
        "security_group_ids": [],
        "nics": [nic],
        "private_ip": None,
        "associate_public_ip": None,
        "tags": {},
        "ebs_optimized": False,
        "disable_api_stop": False,
        "instance_market_options": {},
        "instance_initiated_shutdown_behavior": None,
        "launch_template": {},
        "hibernation_options": {},
        "iam_instance_profile_name": None,
        "iam_instance_profile_arn": None,
        "monitoring_state": "disabled",
        "ipv6_address_count": None,
        "metadata_options": {},
        "client_token": "ABCDE",
    }
    return backend.run_instances(image_id, 1, None, [], **params).instances[0]
