"""The node's datapath: what ipamd sets up in the host's network namespace so that every pod address,
on whichever ENI it lives, carries traffic (per-ENI route tables, per-pod policy rules, SNAT)."""
