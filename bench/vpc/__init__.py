"""The emulated VPC and a node in it, run by the end-to-end tests (`tests/e2e/`) and by the benches
that start pods through a real containerd (`bench.cni_burst`).

`fabric` owns the emulated network (names, addresses, the static topology, and the commands that make
the VPC fabric follow EC2), `fabric_ipv6` its IPv6; `world` is the process that plays EC2, IMDS, the
hypervisor and the fabric, `ready` the file it says it is up with; `node` is a whole node in its
namespaces (the world process, containerd and `ipamd run`), whose probes the tests add
(`tests/e2e/vpc/harness.py`); `containerd` a private containerd and its CRI client, `pause` the
sandbox image built without a registry, and `processes` what the node is driven by from outside
(`ipamd run` as a process and its API, waiting, namespaces, work dirs).

It lives here rather than under `tests/` because benches import nothing from `tests/` (the import
contract); the tests of the emulated VPC itself stay in `tests/e2e/vpc/`.
"""
