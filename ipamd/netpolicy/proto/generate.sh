#!/bin/sh
# Regenerates ipamd/netpolicy/_generated/ from rpc.proto with grpc_tools.protoc (a dev dependency:
# the generated code needs only grpcio and protobuf at run time), as ipamd/runtime/proto/generate.sh
# does for the CRI proto. Run from anywhere:
#     ipamd/netpolicy/proto/generate.sh            (uses .venv/bin/python, or $PYTHON)
# then commit the result. The output is deterministic for a given grpcio-tools version.
set -eu

root=$(cd "$(dirname "$0")/../../.." && pwd)
python=${PYTHON:-"$root/.venv/bin/python"}
proto_dir="$root/ipamd/netpolicy/proto"
out="$root/ipamd/netpolicy/_generated"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# google/protobuf/empty.proto comes with grpcio-tools' own include directory.
include=$("$python" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
"$python" -m grpc_tools.protoc -I "$proto_dir" -I "$include" \
    --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" \
    "$proto_dir/rpc.proto"

# protoc writes `import rpc_pb2`, which only works with the output directory on sys.path; the
# package imports its sibling relatively instead.
sed -i 's/^import rpc_pb2 as /from . import rpc_pb2 as /' "$tmp/rpc_pb2_grpc.py"

# Generated code is not ours to lint, format or type-check: the headers keep ruff and mypy off it
# even when a file is named explicitly.
tools="grpcio-tools $("$python" -c 'import grpc_tools.grpc_version as g; print(g.VERSION)')"
tools="$tools, $("$python" -m grpc_tools.protoc --version)"
for file in rpc_pb2.py rpc_pb2.pyi rpc_pb2_grpc.py; do
    {
        echo "# Generated from ipamd/netpolicy/proto/rpc.proto by generate.sh ($tools). Do not edit."
        echo "# ruff: noqa"
        echo "# fmt: off"
        echo "# mypy: ignore-errors"
        cat "$tmp/$file"
    } > "$out/$file"
done
echo "generated: $(cd "$out" && echo rpc_pb2.py rpc_pb2.pyi rpc_pb2_grpc.py)"
