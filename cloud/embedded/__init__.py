"""The embedded cloud: moto's EC2 extended with the behaviour ipamd depends on (`moto_ext`), fault
injection on boto3 clients (`faults`), a ready-made VPC, subnet and instance (`world`) with extra
subnets and VPC CIDR blocks on request (`world_layout`), subnets fragmented on purpose (`fragment`), and
a world kept in a file across restarts (`cloud_keeper`, on `cloud_file` and `cloud_restore`).

For tests and `ipamd run --embedded` only; the daemon proper never imports this package (only
`ipamd.node.embedded`, the composition root's embedded half, does). Importing it is cheap: moto is
loaded by the modules that need it.
"""
