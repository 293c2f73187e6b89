#!/usr/bin/env bash
# The system tools the test suite uses, installed when missing (make test runs this).
#   curl               the README quick start
#   flock, unshare     util-linux: the venv lock, private network namespaces
#   iptables, ip       partition and loopback-rule tests in a private network namespace
#   chromium           browser tests (playwright drives it with executable_path)
#   dockerd, docker-compose, docker compose, debootstrap
#                      the compose test (tests/compose): Debian's docker.io, Compose 1.29,
#                      Compose v2 (from Debian trixie's docker-compose package: bookworm has
#                      only 1.29), and a Debian base image made without a registry
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
if [ ${#missing[@]} -gt 0 ]; then
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
fi

# Compose v2 as the docker CLI plugin: the binary of Debian trixie's docker-compose package
# (it runs on bookworm), fetched from Debian's mirror and checked against its hash.
COMPOSE_V2_DEB=docker-compose_2.26.1-4_amd64.deb
COMPOSE_V2_SHA256=47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea
COMPOSE_V2_URL=http://deb.debian.org/debian/pool/main/d/docker-compose/$COMPOSE_V2_DEB
PLUGINS=/usr/local/lib/docker/cli-plugins
if ! docker compose version >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ] || [ "$(dpkg --print-architecture)" != amd64 ]; then
    echo "the compose test needs Compose v2 ('docker compose'): install Debian's" >&2
    echo "docker-compose >= 2.23 (trixie) or Docker's compose plugin into $PLUGINS" >&2
    exit 1
  fi
  echo "installing Compose v2 into $PLUGINS (from Debian's $COMPOSE_V2_DEB)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  curl -fsSL --retry 3 -o "$work/compose.deb" "$COMPOSE_V2_URL"
  echo "$COMPOSE_V2_SHA256  $work/compose.deb" | sha256sum -c --quiet -
  dpkg-deb -x "$work/compose.deb" "$work/root"
  install -D -m 0755 "$work/root/usr/libexec/docker/cli-plugins/docker-compose" \
    "$PLUGINS/docker-compose"
  docker compose version
fi
