#!/usr/bin/env bash
# The system tools the test suite uses, installed when missing (make test runs this).
#   curl               the README quick start
#   flock, unshare     util-linux: the venv lock, private network namespaces
#   iptables, ip       partition and loopback-rule tests in a private network namespace
#   chromium           browser tests (playwright drives it with executable_path)
#   dockerd, docker-compose, debootstrap
#                      the compose test (tests/compose): Debian's docker.io, Compose 1.29,
#                      and a Debian base image made without a registry
#   go, protoc, protoc-gen-go, protoc-gen-go-grpc, and the Go sources of grpc-go and of
#   protobuf's 1.5 API: the grpc-go client of tests/interop (GOPATH mode, no module proxy)
# As root it installs what is missing with apt-get; otherwise it prints the exact command
# and fails, so that no test is skipped for want of a tool.
set -euo pipefail
declare -A PACKAGE=([curl]=curl [flock]=util-linux [unshare]=util-linux [iptables]=iptables
                    [ip]=iproute2 [chromium]=chromium [go]=golang-go [protoc]=protobuf-compiler
                    [protoc-gen-go]=protoc-gen-go [protoc-gen-go-grpc]=protoc-gen-go-grpc
                    [dockerd]=docker.io [docker-compose]=docker-compose
                    [debootstrap]=debootstrap)
LIBRARIES=(golang-google-grpc-dev golang-github-golang-protobuf-1-5-dev)
missing=()
for tool in curl flock unshare iptables ip chromium go protoc protoc-gen-go protoc-gen-go-grpc \
            dockerd docker-compose debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${PACKAGE[$tool]}")
done
for library in "${LIBRARIES[@]}"; do
  dpkg-query -W -f='${Status}' "$library" 2>/dev/null | grep -q "ok installed" ||
    missing+=("$library")
done
[ ${#missing[@]} -eq 0 ] && exit 0
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" -ne 0 ]; then
  echo "the tests need these Debian packages: $packages" >&2
  echo "install them with:  sudo apt-get install -y $packages" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "the tests need: $packages (no apt-get here: install them with your package manager)" >&2
  exit 1
fi
echo "installing system packages: $packages"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages
