"""The CNI IPAM plugin `ipamd-cni`: standard library and `ipamd.wire` only."""
