"""ipamd and the Kubernetes API server: its own node's objects only."""
