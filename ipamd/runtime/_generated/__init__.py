"""Python code generated from `ipamd/runtime/proto/cri_v1.proto` (ipamd's subset of CRI v1). Do not edit:
run `ipamd/runtime/proto/generate.sh` and commit the result. Imported only by `ipamd.runtime.cri` (and the
CRI test double); protobuf messages never leave `ipamd/runtime/`."""
