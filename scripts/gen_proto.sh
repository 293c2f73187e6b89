#!/bin/sh
# Regenerate doq_lib/pb/ from proto/doq.proto. Run from the repository root with the venv's
# python (grpcio-tools is pinned in requirements-dev.txt; tests/grpc/test_proto.py checks that
# the committed code matches what this produces).
set -eu
PY=${PY:-python}
# The mapping makes protoc see the file as doq_lib/pb/doq.proto, so the generated stubs
# import their messages as `from doq_lib.pb import doq_pb2`.
"$PY" -m grpc_tools.protoc --proto_path=doq_lib/pb=proto \
  --python_out=. --pyi_out=. --grpc_python_out=. proto/doq.proto
