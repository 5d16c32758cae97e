"""The container runtime as ipamd sees it: which pod sandboxes exist. The CRI port and its gRPC adapter."""
