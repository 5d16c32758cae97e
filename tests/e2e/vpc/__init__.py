"""End to end (c): ipamd's datapath in an emulated VPC, where EC2's source/destination check drops
packets and counts them.

`fabric` owns the emulated network (names, addresses, the static topology, and the commands that make
the VPC fabric follow EC2); `world` is the process that plays EC2, IMDS, the hypervisor and the fabric;
`harness` is the tests' side (namespaces, the world process, containerd and ipamd in the node, probes);
`test_datapath` holds the datapath's tests.

The takeover from aws-node: `aws_node` prepares a node as aws-node leaves it (through
`aws_node_ec2`, run where the world's EC2 listens, and `aws_cni_plugin`, a stand-in for VPC CNI's
plugin) and says what of it is left; `pings` runs the pings that must go on through the takeover
and counts what they lost; `test_takeover` holds the tests.
"""
