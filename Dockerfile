# syntax=docker/dockerfile:1
# DOQ server image: one node per container (`python doq.py serve [flags]`).
#   docker build -t doq:latest .
#   docker run --rm -p 8000:8000 -v doq-data:/usr/local/doq/data doq:latest
# Flags given to `docker run` / compose `command:` / Kubernetes `args:` are appended to
# the entrypoint, e.g. `doq:latest --cluster.node_id node-1 --raft.address node-1:9000`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    DOQ_STORAGE_DATA_DIR=/usr/local/doq/data

# Non-root runtime user with a fixed numeric uid/gid (Kubernetes runAsNonRoot checks the
# number; the manifests in deploy/ use the same ids).
RUN groupadd --gid 10001 doq \
    && useradd --uid 10001 --gid 10001 --no-create-home --no-log-init \
       --home-dir /nonexistent --shell /usr/sbin/nologin doq \
    && mkdir -p /usr/local/doq/app /usr/local/doq/data \
    && chown 10001:10001 /usr/local/doq/data \
    && chmod 0700 /usr/local/doq/data

# The working directory: a config.yaml mounted here is read at start-up (flags still win).
WORKDIR /usr/local/doq/app

# Runtime dependencies only (requirements-dev.txt is for the test suite). Every pinned
# package ships manylinux wheels for CPython 3.11, so no compiler is needed.
COPY requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt

# Application code, owned by root and read-only for the runtime user. Byte-code is
# compiled now because the container (readOnlyRootFilesystem) cannot write it later.
COPY doq.py ./
COPY doq_lib ./doq_lib
COPY tui ./tui
COPY webui ./webui
RUN python -m compileall -q doq.py doq_lib tui

# <data_dir>/<node_id>/ holds the Raft journal and the LMDB store.
VOLUME ["/usr/local/doq/data"]

# HTTP (REST API, admin UI, /metrics, health), Raft, gRPC.
EXPOSE 8000 9000 10000

USER 10001:10001

# SIGTERM: a leader hands leadership over before it exits (give it ~10 s).
STOPSIGNAL SIGTERM

# /livez answers 200 while the process serves HTTP (slim images have no curl).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/livez', timeout=4)"]

ENTRYPOINT ["python", "doq.py", "serve"]
