# DOQ developer targets. `make run` and `make test` work from a clean clone.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed

.PHONY: venv install compose run test test-fast lint sysdeps docs bench run_node_0 run_node_1 run_node_2 clean

venv: $(STAMP)

# Two stamps: `make run` installs what a node needs (requirements.txt); the tests' and the
# tools' packages (requirements-dev.txt, several hundred MB) come with `make test`.
# flock: several `make run_node_N` started at once must not build the venv concurrently.
$(RUNTIME): requirements.txt
	flock .venv.lock sh -c '[ -f $(RUNTIME) ] && [ $(RUNTIME) -nt requirements.txt ] || { \
	  { [ -x $(PY) ] || $(PYTHON) -m venv $(VENV); } && \
	  $(PY) -m pip install --quiet --upgrade pip && \
	  $(PY) -m pip install --quiet -r requirements.txt && touch $(RUNTIME); }'

$(STAMP): $(RUNTIME) requirements-dev.txt
	flock .venv.lock sh -c '[ -f $(STAMP) ] && [ $(STAMP) -nt requirements-dev.txt ] && \
	  [ $(STAMP) -nt $(RUNTIME) ] || { \
	  $(PY) -m pip install --quiet -r requirements-dev.txt && touch $(STAMP); }'

# The node's packages only, in .venv (what `make run` starts from).
install: $(RUNTIME)

# The docker-compose cluster on a machine that reaches no container registry: the image is
# built from a Debian base made with debootstrap and wheels built here (as root, once for
# the base). With a registry, `docker compose up --build -d` does it all.
# Compose v2 (`docker compose`) when there is one, else Compose 1.29 (`docker-compose`);
# `make compose COMPOSE=docker-compose` chooses.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || \
	echo docker-compose)
compose: $(RUNTIME)
	PYTHON=$(PY) bash scripts/compose_image.sh
	$(COMPOSE) up -d

# A single node with its data in ./data (HTTP :8000, Raft :9000, gRPC :10000).
run: $(RUNTIME)
	$(PY) doq.py serve --cluster.node_id node-0 --http.port 8000 \
	  --raft.address localhost:9000 --grpc.address localhost:10000 --storage.data_dir data

# Installs missing system packages first (as root; otherwise it says which to install).
test: sysdeps lint
	$(PY) -m pytest -q tests

# The in-process tiers and unit tests (tests/core, tests/local), the slow ones left out:
# about a minute, no cluster started. `make test` runs everything.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests/core tests/local

sysdeps:
	bash scripts/system_deps.sh

lint: $(STAMP)
	$(PY) -m ruff check doq_lib doq.py tests scripts tui
	$(PY) -m mypy

# A local three-node cluster: run each target in its own terminal.
PEERS := localhost:9000,localhost:9001,localhost:9002
run_node_0: $(RUNTIME)
	$(PY) doq.py serve --cluster.node_id node-0 --http.port 8000 --raft.address localhost:9000 \
	  --grpc.address localhost:10000 --cluster.peers $(PEERS) --storage.data_dir data
run_node_1: $(RUNTIME)
	$(PY) doq.py serve --cluster.node_id node-1 --http.port 8001 --raft.address localhost:9001 \
	  --grpc.address localhost:10001 --cluster.peers $(PEERS) --storage.data_dir data
run_node_2: $(RUNTIME)
	$(PY) doq.py serve --cluster.node_id node-2 --http.port 8002 --raft.address localhost:9002 \
	  --grpc.address localhost:10002 --cluster.peers $(PEERS) --storage.data_dir data

# The manual (docs/, mkdocs.yml) as a site on http://127.0.0.1:8008, rebuilt on every change;
# `make test` builds it with --strict.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:8008

bench: $(STAMP)
	$(PY) scripts/bench/http_bench.py

clean:
	rm -rf $(VENV) .pytest_cache site
