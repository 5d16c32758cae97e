"""EC2 as aws-node leaves it, made through the world's EC2 endpoint: `python -m
tests.e2e.vpc.aws_node_ec2 <spec.json>`, run under `nsenter --net=<node>` (the endpoint listens on
the node's loopback). Prints the instance's ENIs afterwards as JSON.

The spec: `ec2_url`, `region`, `instance_id`, `primary_eni_id`, and `secondary_ips`: device index →
how many secondary addresses that ENI gets. Index 0 is the primary ENI (addresses assigned to it);
every other index gets an ENI created in the primary's subnet with its security groups, VPC CNI's
description (`aws-K8S-<instance id>`) and tags (`node.k8s.amazonaws.com/instance_id`,
`node.k8s.amazonaws.com/createdAt`), attached at that index and deleted on termination, as
`awsutils.AllocENI` makes them.

Output: a list of `{eni_id, device_index, mac, primary_ip, secondary_ips}` by device index.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3

from cloud.ports import TAG_CREATED_AT, TAG_INSTANCE_ID


def client(spec: dict[str, Any]) -> Any:
    return boto3.client(
        "ec2",
        endpoint_url=spec["ec2_url"],
        region_name=spec["region"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def prepare(spec: dict[str, Any]) -> list[dict[str, Any]]:
    ec2 = client(spec)
    instance_id = str(spec["instance_id"])
    primary = ec2.describe_network_interfaces(NetworkInterfaceIds=[spec["primary_eni_id"]])[
        "NetworkInterfaces"
    ][0]
    groups = [g["GroupId"] for g in primary.get("Groups", [])]
    created_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for index, count in sorted((int(k), int(v)) for k, v in spec["secondary_ips"].items()):
        if index == 0:
            ec2.assign_private_ip_addresses(
                NetworkInterfaceId=primary["NetworkInterfaceId"],
                SecondaryPrivateIpAddressCount=count,
            )
            continue
        eni = ec2.create_network_interface(
            SubnetId=primary["SubnetId"],
            Groups=groups,
            Description=f"aws-K8S-{instance_id}",
            SecondaryPrivateIpAddressCount=count,
            TagSpecifications=[
                {
                    "ResourceType": "network-interface",
                    "Tags": [
                        {"Key": TAG_INSTANCE_ID, "Value": instance_id},
                        {"Key": TAG_CREATED_AT, "Value": created_at},
                    ],
                }
            ],
        )["NetworkInterface"]
        eni_id = eni["NetworkInterfaceId"]
        attachment = ec2.attach_network_interface(
            NetworkInterfaceId=eni_id, InstanceId=instance_id, DeviceIndex=index
        )["AttachmentId"]
        ec2.modify_network_interface_attribute(
            NetworkInterfaceId=eni_id,
            Attachment={"AttachmentId": attachment, "DeleteOnTermination": True},
        )
    return describe(ec2, instance_id)


def describe(ec2: Any, instance_id: str) -> list[dict[str, Any]]:
    filters = [{"Name": "attachment.instance-id", "Values": [instance_id]}]
    enis = []
    for eni in ec2.describe_network_interfaces(Filters=filters)["NetworkInterfaces"]:
        addresses = eni.get("PrivateIpAddresses", [])
        enis.append(
            {
                "eni_id": eni["NetworkInterfaceId"],
                "device_index": int(eni["Attachment"]["DeviceIndex"]),
                "mac": str(eni["MacAddress"]).lower(),
                "primary_ip": eni["PrivateIpAddress"],
                "secondary_ips": [a["PrivateIpAddress"] for a in addresses if not a["Primary"]],
            }
        )
    return sorted(enis, key=lambda e: int(e["device_index"]))


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    print(json.dumps(prepare(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
