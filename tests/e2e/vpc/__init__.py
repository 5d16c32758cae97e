"""End to end (c): ipamd's datapath in an emulated VPC, where EC2's source/destination check drops
packets and counts them.

The emulated VPC itself lives in `bench.vpc`, which the benches share: `fabric` (the emulated
network), `world` (the process that plays EC2, IMDS, the hypervisor and the fabric) and `node` (the
namespaces, the world process, containerd and ipamd in the node). Here: `harness`, the tests' side
(the node with its probes, and `vpc_node`, skipped without root); `rules`, ipamd's policy rules as
the kernel lists them; `test_datapath` holds the datapath's tests; `test_device_index` a device
index ipamd freed after a restart, taken again by the next new ENI, which carries its pods' traffic.

IPv6: `bench.vpc.fabric_ipv6` adds the VPC's IPv6 for a dual-stack world (`ec2_ipv6` lists and assigns the
primary ENI's /80s from inside the node, `probes6` holds the IPv6 tests' probes); `test_ipv6` tests
the fabric's IPv6 alone and `test_ipv6_node` an IPv6 node run by ipamd.

The takeover from aws-node: `aws_node` prepares a node as aws-node leaves it (through
`aws_node_ec2`, run where the world's EC2 listens, and `aws_cni_plugin`, a stand-in for VPC CNI's
plugin) and says what of it is left; `pings` runs the pings that must go on through the takeover
and counts what they lost; `test_takeover` holds the tests.

Services: `kube_proxy` writes kube-proxy's rules (iptables or nftables mode) into a node, and `tcp`
carries real TCP through them (an echo server, a one-shot probe, and a watch that opens a fresh
connection every 200 ms); `test_takeover_services` proves NodePort and hostPort connections to pods
on secondary ENIs never fail while ipamd takes over from aws-node, reconciles and restarts.
"""
