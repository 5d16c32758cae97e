"""EKS network policy through VPC CNI's gRPC contract: ipamd's config server for
aws-network-policy-agent, the client of the agent's NPBackend, and when a pod's ADD and DEL call it."""
