"""Reconcilers: keep ipamd's view honest against EC2 and the container runtime. Each is a plain object
with `run_once()`; scheduling lives elsewhere."""
