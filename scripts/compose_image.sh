#!/usr/bin/env bash
# Builds the image doq:latest on a machine that reaches Debian's mirror and PyPI (through
# the host's pip settings) but no container registry; `make compose` runs it, and so does
# the compose test. With registry access `docker compose up --build -d` needs none of this.
#   1. a base image doq-base:bookworm: Debian bookworm (python3 3.11, python3-venv) made with
#      debootstrap and imported, once (it is kept for the next build);
#   2. the wheels of requirements.txt, built on the host into deploy/wheels/;
#   3. the Dockerfile built from that base with pip reading only those wheels.
# Needs root for debootstrap, and docker. Environment: DOQ_IMAGE (doq:latest),
# DOQ_BASE_IMAGE (doq-base:bookworm), DEBIAN_MIRROR (http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${DOQ_IMAGE:-doq:latest}
BASE=${DOQ_BASE_IMAGE:-doq-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { echo "needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
  [ "$(id -u)" -eq 0 ] || { echo "debootstrap needs root: run this as root once" >&2; exit 1; }
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  echo "making $BASE with debootstrap (about a minute)"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" "$MIRROR" \
    > "$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
  rm -f "$root.log"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import -c 'ENV LANG=C.UTF-8' - "$BASE" >/dev/null
  rm -rf "$root"
  trap - EXIT
fi

echo "building the wheels of requirements.txt into deploy/wheels/"
find deploy/wheels -name '*.whl' -delete
log=$(mktemp)
"$PYTHON" -m pip wheel --disable-pip-version-check -r requirements.txt -w deploy/wheels \
  > "$log" 2>&1 || { tail -30 "$log" >&2; rm -f "$log"; exit 1; }
rm -f "$log"

echo "building $IMAGE from $BASE"
log=$(mktemp)
docker build --build-arg "BASE=$BASE" --build-arg PIP_OFFLINE=1 -t "$IMAGE" . > "$log" 2>&1 ||
  { tail -30 "$log" >&2; rm -f "$log"; exit 1; }
rm -f "$log"
echo "built $IMAGE"
