"""ipamd: a node IP-address daemon for Kubernetes on AWS."""
