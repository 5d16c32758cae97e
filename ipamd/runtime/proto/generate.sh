#!/bin/sh
# Regenerates ipamd/runtime/_generated/ from cri_v1.proto with grpc_tools.protoc (a dev dependency:
# the generated code needs only grpcio and protobuf at run time). Run from anywhere:
#     ipamd/runtime/proto/generate.sh            (uses .venv/bin/python, or $PYTHON)
# then commit the result. The output is deterministic for a given grpcio-tools version.
set -eu

root=$(cd "$(dirname "$0")/../../.." && pwd)
python=${PYTHON:-"$root/.venv/bin/python"}
proto_dir="$root/ipamd/runtime/proto"
out="$root/ipamd/runtime/_generated"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$python" -m grpc_tools.protoc -I "$proto_dir" \
    --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" \
    "$proto_dir/cri_v1.proto"

# protoc writes `import cri_v1_pb2`, which only works with the output directory on sys.path; the
# package imports its sibling relatively instead.
sed -i 's/^import cri_v1_pb2 as /from . import cri_v1_pb2 as /' "$tmp/cri_v1_pb2_grpc.py"

# Generated code is not ours to lint, format or type-check: the headers keep ruff and mypy off it
# even when a file is named explicitly.
tools="grpcio-tools $("$python" -c 'import grpc_tools.grpc_version as g; print(g.VERSION)')"
tools="$tools, $("$python" -m grpc_tools.protoc --version)"
for file in cri_v1_pb2.py cri_v1_pb2.pyi cri_v1_pb2_grpc.py; do
    {
        echo "# Generated from ipamd/runtime/proto/cri_v1.proto by generate.sh ($tools). Do not edit."
        echo "# ruff: noqa"
        echo "# fmt: off"
        echo "# mypy: ignore-errors"
        cat "$tmp/$file"
    } > "$out/$file"
done
echo "generated: $(cd "$out" && echo cri_v1_pb2.py cri_v1_pb2.pyi cri_v1_pb2_grpc.py)"
