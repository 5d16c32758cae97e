"""Python code generated from `ipamd/netpolicy/proto/rpc.proto` (ipamd's subset of VPC CNI's gRPC
contract). Do not edit: run `ipamd/netpolicy/proto/generate.sh` and commit the result. Imported only by
`ipamd.netpolicy`'s gRPC modules (and the agent's test double); protobuf messages never leave
`ipamd/netpolicy/`."""
