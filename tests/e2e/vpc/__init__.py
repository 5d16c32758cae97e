"""End to end (c): ipamd's datapath in an emulated VPC, where EC2's source/destination check drops
packets and counts them.

`fabric` owns the emulated network (names, addresses, the static topology, and the commands that make
the VPC fabric follow EC2); `world` is the process that plays EC2, IMDS, the hypervisor and the fabric;
`harness` is the tests' side (namespaces, the world process, containerd and ipamd in the node, probes);
`test_datapath` holds the tests.
"""
