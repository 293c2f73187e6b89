# DOQ server image: one node per container (`doq serve [flags]`).
#   docker build -t doq:latest .
#   docker run --rm -p 8000:8000 -v doq-data:/usr/local/doq/data doq:latest
# Flags given to `docker run` / compose `command:` / Kubernetes `args:` are appended to
# the entrypoint, e.g. `doq:latest --cluster.node_id node-1 --raft.address node-1:9000`.
#
# Any Debian-like base with Python 3.11 will do. The default needs a registry; a machine
# without one builds from a local Debian bookworm image (its python3 is 3.11, with
# python3-venv) and the wheels in deploy/wheels/, which is what `make compose` does:
#   docker build --build-arg BASE=doq-base:bookworm --build-arg PIP_OFFLINE=1 -t doq:latest .
# No `# syntax=` line: that would make BuildKit fetch a frontend image from a registry.
ARG BASE=python:3.11-slim

# -- the virtual environment, built apart so that the wheels stay out of the image ---------
FROM ${BASE} AS venv
ARG PIP_OFFLINE=0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
COPY requirements.txt /tmp/build/
COPY deploy/wheels/ /tmp/build/wheels/
# A venv, not the system's Python: Debian's python3 refuses `pip install` (PEP 668).
# PIP_OFFLINE=1: the wheels folder only, no index (pip inside a build may not reach one).
RUN set -eu; \
    if [ "$PIP_OFFLINE" = 1 ]; then set -- --no-index; else set --; fi; \
    python3 -m venv /usr/local/doq/venv; \
    /usr/local/doq/venv/bin/pip install "$@" --find-links /tmp/build/wheels \
        -r /tmp/build/requirements.txt

# -- the image ------------------------------------------------------------------------------
FROM ${BASE}

# The full PATH, not ${PATH}: a base made with `docker import` has none to extend.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8 \
    PATH=/usr/local/doq/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    DOQ_STORAGE_DATA_DIR=/usr/local/doq/data

# Non-root runtime user with a fixed numeric uid/gid (Kubernetes runAsNonRoot checks the
# number; the manifests in deploy/ use the same ids).
RUN groupadd --gid 10001 doq \
    && useradd --uid 10001 --gid 10001 --no-create-home --no-log-init \
       --home-dir /nonexistent --shell /usr/sbin/nologin doq \
    && mkdir -p /usr/local/doq/app /usr/local/doq/data \
    && chown 10001:10001 /usr/local/doq/data \
    && chmod 0700 /usr/local/doq/data

# Runtime dependencies only (requirements-dev.txt is for the test suite).
COPY --from=venv /usr/local/doq/venv /usr/local/doq/venv

# The working directory: a config.yaml mounted here is read at start-up (flags still win).
WORKDIR /usr/local/doq/app

# Application code, owned by root and read-only for the runtime user. Byte-code is
# compiled now because the container (readOnlyRootFilesystem) cannot write it later.
COPY doq.py ./
COPY doq_lib ./doq_lib
COPY tui ./tui
COPY webui ./webui
COPY deploy/docker-entrypoint.sh ./
RUN python -m compileall -q doq.py doq_lib tui

# <data_dir>/<node_id>/ holds the Raft journal and the LMDB store.
VOLUME ["/usr/local/doq/data"]

# HTTP (REST API, admin UI, /metrics, health), Raft, gRPC.
EXPOSE 8000 9000 10000

# The node runs as uid 10001. Started as root instead (docker-compose.yml does), the entry
# point copies the mounted secrets for that user and then drops to it.
USER 10001:10001

# SIGTERM: a leader hands leadership over before it exits (give it ~10 s).
STOPSIGNAL SIGTERM

# /livez answers 200 while the process serves HTTP (slim images have no curl).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/livez', timeout=4)"]

ENTRYPOINT ["./docker-entrypoint.sh"]
