#!/usr/bin/env bash
# Builds floor.cc: Envoy's ext_proc protos compiled for C++ from the descriptors xds-protos carries.
# Needs Debian's libgrpc++-dev, protobuf-compiler-grpc, libprotobuf-dev, protobuf-compiler and pkg-config.
# Usage: experiments/native_ext_proc/build.sh [OUT_DIR]   (default build/native-ext-proc); prints the binaries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(mkdir -p "${1:-$root/build/native-ext-proc}" && cd "${1:-$root/build/native-ext-proc}" && pwd)
python=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$out/gen"
"$python" - "$out/protos.pb" > "$out/files" <<'PY'
import sys
from envoy.service.ext_proc.v3 import external_processor_pb2
from google.protobuf import descriptor_pb2

files: list = []
def add(fd) -> None:
    if any(f.name == fd.name for f in files):
        return
    for dep in fd.dependencies:
        add(dep)
    files.append(fd)
add(external_processor_pb2.DESCRIPTOR)
bundle = descriptor_pb2.FileDescriptorSet()
for fd in files:
    fd.CopyToProto(bundle.file.add())
open(sys.argv[1], "wb").write(bundle.SerializeToString())
print(" ".join(f.name for f in files if not f.name.startswith("google/")))  # libprotobuf has google/'s
PY
protoc --descriptor_set_in="$out/protos.pb" --cpp_out="$out/gen" $(cat "$out/files")
protoc --descriptor_set_in="$out/protos.pb" --grpc_out="$out/gen" --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" \
    envoy/service/ext_proc/v3/external_processor.proto
flags=$(pkg-config --cflags --libs grpc++ protobuf)
objects=()
for source in $(find "$out/gen" -name '*.cc'); do
    g++ -O2 -std=c++17 -I"$out/gen" -c "$source" -o "${source%.cc}.o" $flags
    objects+=("${source%.cc}.o")
done
for name in floor floor_cq; do  # the two servers, on gRPC C++'s callback API and on its completion queue
    g++ -O2 -std=c++17 -I"$here" -I"$out/gen" "$here/$name.cc" "${objects[@]}" -o "$out/$name" $flags
    echo "$out/$name"
done
