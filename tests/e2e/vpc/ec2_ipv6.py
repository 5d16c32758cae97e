"""An ENI's IPv6 /80 prefixes through the world's EC2 endpoint: `python -m tests.e2e.vpc.ec2_ipv6
<ec2_url> <region> <eni_id> list|assign`, run under `nsenter --net=<node>` (the endpoint listens on
the node's loopback). `list` prints the /80s DescribeNetworkInterfaces lists on the ENI, `assign`
first gives it one more (AssignIpv6Addresses with Ipv6PrefixCount 1, as ipamd asks); one per line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import boto3


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 4 or args[3] not in ("list", "assign"):
        print("usage: python -m tests.e2e.vpc.ec2_ipv6 <ec2_url> <region> <eni_id> list|assign")
        return 2
    url, region, eni_id, command = args
    ec2 = boto3.client(
        "ec2",
        endpoint_url=url,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    if command == "assign":
        ec2.assign_ipv6_addresses(NetworkInterfaceId=eni_id, Ipv6PrefixCount=1)
    eni = ec2.describe_network_interfaces(NetworkInterfaceIds=[eni_id])["NetworkInterfaces"][0]
    for prefix in eni.get("Ipv6Prefixes", []):
        print(prefix["Ipv6Prefix"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
