"""Deployment files validated offline: Dockerfile, docker-compose.yml, deploy/ (SPEC §7, §9).

Schemas come bundled with the validators (no network): ``kubernetes-validate`` for the
Kubernetes manifests (strict, so unknown fields fail) and ``check-jsonschema``'s vendored
Compose specification. Every command line is also run through the real ``doq.py`` option
parser and configuration validation.
"""
from __future__ import annotations

import ast
import copy
import fnmatch
import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import doq
from doq_lib.config import KEYS

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
K8S_VERSION = "1.30"          # bundled by kubernetes-validate (no download)
DATA_DIR = "/usr/local/doq/data"
UID = 10001
PORTS = {"http": 8000, "raft": 9000, "grpc": 10000}
NODES = ("node-0", "node-1", "node-2")
FLAG_RE = re.compile(r"--([a-z_]+(?:\.[a-z_]+)+)(?:=|$)")


# -- loading -------------------------------------------------------------------------------
def _yaml_documents(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def _kustomization() -> dict[str, Any]:
    (doc,) = _yaml_documents(DEPLOY / "kustomization.yaml")
    return doc


def _manifest_files() -> list[str]:
    return sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object, for every object of every manifest."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for name in _manifest_files():
        for doc in _yaml_documents(DEPLOY / name):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in found, f"{key} defined twice"
            found[key] = doc
    return found


def _one(kind: str) -> dict[str, Any]:
    matches = [obj for (k, _), obj in _objects().items() if k == kind]
    assert len(matches) == 1, f"expected exactly one {kind}, found {len(matches)}"
    return matches[0]


def _statefulset() -> dict[str, Any]:
    return _one("StatefulSet")


def _container() -> dict[str, Any]:
    (container,) = _statefulset()["spec"]["template"]["spec"]["containers"]
    return container


def _services() -> dict[str, dict[str, Any]]:
    return {name: obj for (kind, name), obj in _objects().items() if kind == "Service"}


def _arg(argv: list[str], flag: str) -> str:
    """The value of ``--flag value`` or ``--flag=value`` in ``argv``."""
    for i, token in enumerate(argv):
        if token == flag:
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {argv}")


_DEFAULTED = re.compile(r"\$\{([A-Z0-9_]+):-([^}]*)\}")


def _interpolated(value: Any) -> Any:
    """The compose file's values with each ``${VAR:-default}`` given its default (what
    Compose does when the variable is not set), the only form the file uses."""
    if isinstance(value, dict):
        return {k: _interpolated(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolated(v) for v in value]
    if isinstance(value, str):
        expanded = _DEFAULTED.sub(lambda m: m[2], value)
        assert "$" not in expanded, f"compose value with an undefaulted variable: {value!r}"
        return expanded
    return value


def _compose(raw: bool = False) -> dict[str, Any]:
    (doc,) = _yaml_documents(COMPOSE)
    return doc if raw else _interpolated(doc)


# -- Dockerfile parsing ----------------------------------------------------------------------
def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        words = (pending + line).split(None, 1)
        pending = ""
        instructions.append((words[0].upper(), words[1] if len(words) > 1 else ""))
    assert not pending, "Dockerfile ends inside a continued line"
    return instructions


def _instr(name: str) -> list[str]:
    return [args for instr, args in _dockerfile() if instr == name]


def _exec_form(args: str) -> list[str]:
    """A JSON-array argument list, or a shell form split into words."""
    if args.lstrip().startswith("["):
        value = json.loads(args)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value)
        return value
    return shlex.split(args)


def _entrypoint() -> list[str]:
    """What the image runs: its ENTRYPOINT, or where that is deploy/docker-entrypoint.sh,
    the command the script runs the node with (the same as root and as any other user)."""
    entrypoints = _instr("ENTRYPOINT")
    assert entrypoints, "the Dockerfile has no ENTRYPOINT"
    entry = _exec_form(entrypoints[-1])
    if entry != ["./docker-entrypoint.sh"]:
        return entry
    script = (REPO / "deploy" / "docker-entrypoint.sh").read_text(encoding="utf-8")
    runs = set()
    for line in re.findall(r"^\s*exec (.*)$", script.replace("\\\n", " "), re.M):
        words = shlex.split(line)
        if words[0] == "setpriv":
            words = [w for w in words[1:] if not w.startswith("--")]
        runs.add(tuple(words))
    assert len(runs) == 1, f"the entry point runs the node in different ways: {runs}"
    (run,) = runs
    assert run[-1] == "$@", run
    return list(run[:-1])


def _stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's build stages, each its instructions from its FROM."""
    stages: list[list[tuple[str, str]]] = []
    for instr, args in _dockerfile():
        if instr == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instr, args))
    return stages


def _dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for args in _instr("ENV"):
        for word in shlex.split(args):
            key, sep, value = word.partition("=")
            assert sep, f"use ENV key=value: {args!r}"
            env[key] = value
    return env


def _copy_sources() -> list[str]:
    sources: list[str] = []
    for args in _instr("COPY") + _instr("ADD"):
        if "--from=" in args:
            continue                          # from another stage, not the build context
        words = [w for w in _exec_form(args) if not w.startswith("--")]
        assert len(words) >= 2, f"COPY needs a source and a destination: {args!r}"
        sources.extend(words[:-1])
    return sources


def _dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """True if ``path`` (relative to the build context) or a parent directory is excluded.
    Simplified matching (``*`` may cross ``/``), so it errs on the side of "excluded"."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
    for pattern in patterns:
        assert not pattern.startswith("!"), "exceptions are not supported by this check"
        pattern = pattern.strip("/")
        candidates = [pattern, pattern[3:]] if pattern.startswith("**/") else [pattern]
        if any(fnmatch.fnmatchcase(p, c) for p in prefixes for c in candidates):
            return True
    return False


# -- command lines ---------------------------------------------------------------------------
def _server_argv(args: list[str]) -> list[str]:
    """What the container runs: the image's entrypoint after ``doq.py``, then ``args``."""
    entry = _entrypoint()
    return entry[entry.index("doq.py") + 1:] + args


def _command_lines() -> Iterator[tuple[str, list[str]]]:
    for name, service in _compose()["services"].items():
        yield f"docker-compose.yml:{name}", list(service["command"])
    yield "deploy/statefulset.yaml", list(_container()["args"])


def _substitute_env_refs(args: list[str], container: dict[str, Any]) -> list[str]:
    """Expand Kubernetes ``$(VAR)`` references; each must name an env var of the container."""
    defined = {e["name"] for e in container.get("env", [])}
    samples = {"POD_NAMESPACE": "doq-test"}

    def expand(match: re.Match[str]) -> str:
        assert match[1] in defined, f"$({match[1]}) is not an env var of the container"
        return samples.get(match[1], "x")

    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", expand, a) for a in args]


# ===========================================================================================
# Kubernetes
# ===========================================================================================
def test_kustomization_lists_every_manifest_and_one_namespace() -> None:
    kustomization = _kustomization()
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == _manifest_files()
    namespace = kustomization["namespace"]
    assert ("Namespace", namespace) in _objects()
    for (kind, name), obj in _objects().items():
        assert obj["metadata"].get("namespace", namespace) == namespace, (kind, name)
    subjects = _one("RoleBinding")["subjects"]
    assert all(s["namespace"] == namespace for s in subjects if s["kind"] == "ServiceAccount")


@pytest.mark.parametrize("name", _manifest_files())
def test_manifest_validates_against_the_kubernetes_schema(name: str) -> None:
    docs = _yaml_documents(DEPLOY / name)
    assert docs, f"{name} is empty"
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def test_strict_kubernetes_validation_rejects_unknown_fields() -> None:
    """The validator really is strict and offline: a misspelt field fails."""
    broken = copy.deepcopy(_statefulset())
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_headless_service_publishes_every_pod_for_discovery() -> None:
    service_name = _arg(_container()["args"], "--cluster.service_name")
    internal = _services()[f"{service_name}-internal"]
    spec = internal["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is True
    assert _statefulset()["spec"]["serviceName"] == internal["metadata"]["name"]
    pod_labels = _statefulset()["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"] and spec["selector"].items() <= pod_labels.items()
    # Only the HTTP port: an SRV lookup without a _port._proto prefix answers one record per
    # pod and per port, and discovery (SPEC §7.4) makes every record a node id / join target.
    assert [(p["name"], p["port"]) for p in spec["ports"]] == [("http", PORTS["http"])]


def test_client_service_follows_the_leader_without_a_selector() -> None:
    service_name = _arg(_container()["args"], "--cluster.service_name")
    client = _services()[service_name]
    assert "selector" not in client["spec"], \
        "the leader's EndpointSlice must be the only endpoints of the client Service"
    assert client["spec"].get("clusterIP") != "None"
    ports = {p["name"]: p["port"] for p in client["spec"]["ports"]}
    # `http` must match the port name of the EndpointSlice the leader writes (SPEC §7.5).
    assert ports == {"http": PORTS["http"], "grpc": PORTS["grpc"]}


def test_rbac_lets_the_leader_manage_its_endpointslice() -> None:
    role, binding = _one("Role"), _one("RoleBinding")
    account = _one("ServiceAccount")["metadata"]["name"]
    verbs: set[str] = set()
    for rule in role["rules"]:
        if "discovery.k8s.io" in rule["apiGroups"] and "endpointslices" in rule["resources"]:
            verbs |= set(rule["verbs"])
    assert {"create", "get", "list", "watch", "update", "delete"} <= verbs
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert any(s["kind"] == "ServiceAccount" and s["name"] == account
               for s in binding["subjects"])
    assert _statefulset()["spec"]["template"]["spec"]["serviceAccountName"] == account


def test_statefulset_runs_a_kubernetes_mode_cluster() -> None:
    spec = _statefulset()["spec"]
    container = _container()
    args = container["args"]
    assert spec["replicas"] == 3
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert "command" not in container, "keep the image's entrypoint (python doq.py serve)"
    assert container["image"] == "doq:latest"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert _arg(args, "--cluster.service_name") == "doq"
    assert _arg(args, "--cluster.namespace") == "$(POD_NAMESPACE)"
    assert {"name": "POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in container["env"]
    assert _arg(args, "--http.port") == str(PORTS["http"])
    assert _arg(args, "--grpc.address") == f"0.0.0.0:{PORTS['grpc']}"
    assert _arg(args, "--raft.address") == f":{PORTS['raft']}"
    assert _arg(args, "--prometheus.enabled") == "true"
    assert _arg(args, "--logging.mode") == "stackdriver"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == PORTS


def test_statefulset_probes_and_shutdown() -> None:
    container = _container()
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert readiness["httpGet"]["path"] == "/readyz"
    assert readiness["periodSeconds"] == 5
    assert liveness["httpGet"]["path"] == "/healthz"
    assert liveness["initialDelaySeconds"] == 120
    for probe in (readiness, liveness):
        port = probe["httpGet"]["port"]
        assert named.get(port, port) == PORTS["http"]
    grace = _statefulset()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert 10 <= grace <= 60, "long enough for a leader hand-over, short enough to restart"


def test_statefulset_security_resources_storage_and_metrics() -> None:
    template = _statefulset()["spec"]["template"]
    pod, container = template["spec"], _container()
    security = pod["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"], security["fsGroup"]) == (UID,) * 3
    assert security["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    resources = container["resources"]
    assert set(resources["requests"]) >= {"cpu", "memory"}
    assert set(resources["limits"]) >= {"cpu", "memory"}
    # The data directory is the volume claimed per pod, and --storage.data_dir points at it.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    (claim,) = _statefulset()["spec"]["volumeClaimTemplates"]
    assert mounts[DATA_DIR] == claim["metadata"]["name"]
    assert _arg(container["args"], "--storage.data_dir") == DATA_DIR
    assert "storage" in claim["spec"]["resources"]["requests"]
    # A read-only root filesystem needs a writable /tmp (request bodies spill there).
    assert "/tmp" in mounts
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(PORTS["http"])
    assert annotations["prometheus.io/path"] == "/metrics"


def test_pod_disruption_budget_keeps_quorum() -> None:
    pdb = _one("PodDisruptionBudget")["spec"]
    assert pdb["maxUnavailable"] == 1
    labels = _statefulset()["spec"]["template"]["metadata"]["labels"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()


def _assert_python_probe(argv: list[str], path: str) -> None:
    """A health check ``python -c <code>`` (slim images have no curl) that GETs ``path``."""
    assert argv[:2] == ["python", "-c"] and len(argv) == 3, argv
    code = argv[2]
    compile(code, "healthcheck", "exec")
    assert "urllib.request.urlopen(" in code and f":{PORTS['http']}{path}'" in code, code
    assert "timeout=" in code, "a hung node must fail the check, not block it"


# ===========================================================================================
# Docker Compose
# ===========================================================================================
def _check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(path)], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_compose_file_validates_against_the_compose_specification() -> None:
    done = _check_jsonschema(COMPOSE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_validation_rejects_unknown_keys(tmp_path: Path) -> None:
    """The vendored schema really checks (offline): a misspelt key fails."""
    broken = _compose()
    broken["services"]["node-1"]["healthchek"] = broken["services"]["node-1"].pop("healthcheck")
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken), encoding="utf-8")
    done = _check_jsonschema(path)
    assert done.returncode == 1 and "healthchek" in done.stdout, done.stdout + done.stderr


def test_compose_runs_three_nodes_where_node_0_bootstraps_and_the_others_join() -> None:
    services = _compose()["services"]
    assert tuple(sorted(services)) == NODES
    for index, name in enumerate(NODES):
        service, command = services[name], services[name]["command"]
        assert (REPO / service["build"]["context"] / service["build"]["dockerfile"]) \
            .resolve() == DOCKERFILE
        assert _arg(command, "--cluster.node_id") == name
        assert _arg(command, "--http.port") == str(PORTS["http"])
        assert _arg(command, "--raft.address") == f"{name}:{PORTS['raft']}"
        assert _arg(command, "--grpc.address") == f"{name}:{PORTS['grpc']}"
        assert _arg(command, "--storage.data_dir") == DATA_DIR
        assert _arg(command, "--prometheus.enabled") == "true"
        # published on loopback by default, and advertised as published (clients on the
        # host cannot resolve node-0)
        assert service["ports"] == [f"127.0.0.1:{8000 + index}:{PORTS['http']}",
                                    f"127.0.0.1:{10000 + index}:{PORTS['grpc']}"]
        assert _arg(command, "--http.advertise") == f"127.0.0.1:{8000 + index}"
        assert _arg(command, "--grpc.advertise") == f"127.0.0.1:{10000 + index}"
        raw = _compose(raw=True)["services"][name]
        assert raw["ports"][0] == _arg(raw["command"], "--http.advertise") + \
            f":{PORTS['http']}", "the advertised HTTP address follows the published one"
        assert raw["ports"][1] == _arg(raw["command"], "--grpc.advertise") + \
            f":{PORTS['grpc']}", "the advertised gRPC address follows the published one"
        if index == 0:
            assert _arg(command, "--cluster.peers") == f"node-0:{PORTS['raft']}"
            assert "--cluster.join_addr" not in command and "depends_on" not in service
        else:
            assert _arg(command, "--cluster.join_addr") == f"node-0:{PORTS['http']}"
            assert "--cluster.peers" not in command
            assert "node-0" in service["depends_on"]


def test_the_cluster_secret_is_a_mounted_secret_never_a_literal() -> None:
    compose = _compose()
    # file secrets (Compose 1.29 has no environment secrets), which the entry point copies
    # for the node's user: the containers start as root for that only
    assert compose["secrets"]["doq_cluster_secret"] == {"file": "./doq-cluster-secret"}
    assert compose["secrets"]["doq_api_keys"] == {"file": "./doq-keys.yaml"}
    entry = (REPO / "deploy" / "docker-entrypoint.sh").read_text(encoding="utf-8")
    assert "/run/secrets/*" in entry and "/run/doq-secrets" in entry
    assert re.search(r"exec setpriv --reuid=%d --regid=%d --clear-groups" % (UID, UID), entry)
    for name, service in compose["services"].items():
        assert service["secrets"] == ["doq_cluster_secret", "doq_api_keys"], name
        assert service["user"] == "root", name
        assert _arg(service["command"], "--raft.password_file") == \
            "/run/doq-secrets/doq_cluster_secret"
        assert _arg(service["command"], "--auth.keys_file") == "/run/doq-secrets/doq_api_keys"
        assert "--raft.password" not in service["command"]
    container = _container()
    assert _arg(container["args"], "--raft.password_file") == \
        "/etc/doq/secrets/cluster-secret"
    assert _arg(container["args"], "--auth.keys_file") == "/etc/doq/secrets/api-keys.yaml"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "secrets")
    assert mount == {"name": "secrets", "mountPath": "/etc/doq/secrets", "readOnly": True}
    volume = next(v for v in _statefulset()["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "secrets")
    assert volume["secret"]["secretName"] == "doq-secrets"
    assert volume["secret"]["items"] == [{"key": "cluster-secret", "path": "cluster-secret"},
                                         {"key": "api-keys.yaml", "path": "api-keys.yaml"}]
    assert ("Secret", "doq-secrets") not in _objects(), "each installation makes its own"


def test_compose_health_volumes_and_shutdown() -> None:
    compose = _compose()
    sources = []
    for name, service in compose["services"].items():
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD", (name, test)
        _assert_python_probe(test[1:], "/readyz")
        (volume,) = service["volumes"]
        source, target = volume.split(":")[:2]
        assert target == DATA_DIR and source in compose["volumes"], (name, volume)
        sources.append(source)
        grace = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
        assert grace and int(grace[1]) >= 10, (name, service["stop_grace_period"])
    assert len(set(sources)) == len(NODES), "every node needs a volume of its own"


# ===========================================================================================
# Dockerfile
# ===========================================================================================
def test_dockerfile_base_user_ports_volume_and_entrypoint() -> None:
    instructions = _dockerfile()
    # One base for every stage, python:3.11-slim unless BASE says otherwise (make compose:
    # a Debian base made without a registry), and no `# syntax=` line, which would make
    # BuildKit fetch its frontend from a registry.
    assert instructions[0] == ("ARG", "BASE=python:3.11-slim")
    assert _instr("FROM") == ["${BASE} AS venv", "${BASE}"]
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE.read_text(encoding="utf-8"),
                         re.M | re.I)
    users = _instr("USER")
    assert users and users[-1].split(":")[0] == str(UID), users
    order = [instr for instr, _ in instructions]
    assert order.index("USER") < order.index("ENTRYPOINT")
    exposed = {int(p.split("/")[0]) for args in _instr("EXPOSE") for p in args.split()}
    assert set(PORTS.values()) <= exposed
    volumes = [v for args in _instr("VOLUME") for v in _exec_form(args)]
    assert DATA_DIR in volumes
    entry = _entrypoint()
    assert entry[:3] == ["python", "doq.py", "serve"], entry
    assert _instr("STOPSIGNAL") == ["SIGTERM"]
    (healthcheck,) = _instr("HEALTHCHECK")
    _assert_python_probe(_exec_form(healthcheck.split(" CMD ", 1)[1]), "/livez")
    # The runtime user owns the data directory (created before VOLUME, so volumes inherit it).
    setup = " ".join(_instr("RUN"))
    assert f"--uid {UID}" in setup and f"chown {UID}:{UID} {DATA_DIR}" in setup


def test_dockerfile_installs_runtime_requirements_only() -> None:
    runs = " ".join(_instr("RUN"))
    assert re.search(r"pip install .*-r \S*requirements\.txt", runs)
    assert "requirements-dev" not in runs + " ".join(_copy_sources())


def test_dockerfile_copies_existing_paths_not_excluded_from_the_context() -> None:
    patterns = _dockerignore()
    sources = [s.rstrip("/") for s in _copy_sources()]
    assert {"doq.py", "doq_lib", "webui", "requirements.txt"} <= set(sources)
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: no such path in the repository"
        assert not _dockerignored(source, patterns), f"COPY {source} is in .dockerignore"
        for path in (REPO / source).rglob("*") if (REPO / source).is_dir() else []:
            rel = path.relative_to(REPO).as_posix()
            if path.is_file() and "__pycache__" not in rel and not rel.endswith(".pyc"):
                assert not _dockerignored(rel, patterns), f"{rel} is excluded by .dockerignore"
    for junk in (".venv", ".git", "data", "doq_lib/__pycache__", "tests/__pycache__",
                 ".pytest_cache"):
        assert _dockerignored(junk, patterns), f".dockerignore should exclude {junk}"


def _guarded(tree: ast.AST) -> set[int]:
    """The ids of import statements inside ``try: ... except ImportError`` (optional ones)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError",
                                                               "ModuleNotFoundError")
                for h in node.handlers):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _imported_top_level_modules(paths: list[Path]) -> dict[str, Path]:
    """Top-level modules imported by ``paths``, but those imported only where an ImportError
    is caught (optional: the code works without them)."""
    modules: dict[str, Path] = {}
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        optional = _guarded(tree)
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                modules.setdefault(name.split(".")[0], path)
    return modules


def _normalise(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def test_image_contains_everything_the_server_imports() -> None:
    """Each module doq.py and doq_lib import is stdlib, copied into the image, or provided
    by a distribution listed in requirements.txt (the only file the image installs). The
    broker integrations (doq_lib/integrations/) are not the server's: each needs its extra
    (pyproject's optional dependencies), which the next test checks."""
    copied = {s.rstrip("/").split("/")[0].removesuffix(".py") for s in _copy_sources()}
    code = [REPO / "doq.py", *sorted(p for p in (REPO / "doq_lib").rglob("*.py")
                                     if "integrations" not in p.parts)]
    lines = (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()
    required = {_normalise(re.split(r"[<>=!~;\[ ]", ln.strip(), maxsplit=1)[0])
                for ln in lines if ln.strip() and not ln.startswith(("#", "-"))}
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module, where in sorted(_imported_top_level_modules(code).items()):
        if module in sys.stdlib_module_names or module in copied:
            continue
        dists = {_normalise(d) for d in providers.get(module, [])}
        if not dists & required:
            shown = ", ".join(sorted(dists)) or "not installed here"
            missing.append(f"{module} (imported by {where.relative_to(REPO)}; {shown})")
    assert not missing, "not in requirements.txt / not copied into the image: " + "; ".join(
        missing)


def test_the_integrations_need_only_their_extras() -> None:
    """What doq_lib/integrations/ imports is stdlib, DOQ's own, in requirements.txt or in
    one of pyproject's extras (celery, django, otel)."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    extras = project["project"]["optional-dependencies"]
    assert {"celery", "django", "otel"} <= set(extras)
    lines = (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()
    allowed = {_normalise(re.split(r"[<>=!~;\[ ]", ln.strip(), maxsplit=1)[0])
               for ln in lines + [d for ds in extras.values() for d in ds]
               if ln.strip() and not ln.startswith(("#", "-"))}
    providers = importlib.metadata.packages_distributions()
    code = sorted((REPO / "doq_lib" / "integrations").rglob("*.py"))
    missing = []
    for module, where in sorted(_imported_top_level_modules(code).items()):
        if module in sys.stdlib_module_names or module in ("doq_lib", "doq"):
            continue
        dists = {_normalise(d) for d in providers.get(module, [])}
        if not dists & allowed:
            missing.append(f"{module} (imported by {where.relative_to(REPO)})")
    assert not missing, "in no extra: " + "; ".join(missing)


# ===========================================================================================
# Flags used by compose and the StatefulSet
# ===========================================================================================
COMMAND_LINES = list(_command_lines())
COMMAND_IDS = [where for where, _ in COMMAND_LINES]


@pytest.mark.parametrize("where,args", COMMAND_LINES, ids=COMMAND_IDS)
def test_every_flag_is_a_doq_configuration_key(where: str, args: list[str]) -> None:
    assert any(a.startswith("--") for a in args), f"{where}: no flags"
    unknown = [a for a in args if a.startswith("--")
               and ((m := FLAG_RE.match(a)) is None or m[1] not in KEYS)]
    assert not unknown, f"{where}: not flags of doq.py serve: {unknown}"


@pytest.mark.parametrize("where,args", COMMAND_LINES, ids=COMMAND_IDS)
def test_command_line_is_accepted_by_doq(where: str, args: list[str], tmp_path: Path) -> None:
    """The container's whole command line goes through doq.py's parser and validation,
    with the image's environment (an empty working directory: no config file)."""
    if where.startswith("deploy/"):
        args = _substitute_env_refs(args, _container())
    mounted = tmp_path / "cluster-secret"        # stand in for the mounted secret files
    mounted.write_text("a cluster secret of a test deployment\n")
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: [{name: ops, role: admin, sha256: '" + "0" * 64 + "'}]\n")
    files = {_arg(args, "--raft.password_file"): str(mounted),
             _arg(args, "--auth.keys_file"): str(keys)}
    args = [files.get(a, a) for a in args]
    cfg = doq.parse_serve(_server_argv(args), _dockerfile_env(), str(tmp_path))
    assert cfg.storage.data_dir == DATA_DIR
    assert cfg.http.port == PORTS["http"]
    assert cfg.prometheus.enabled is True
    if where.startswith("deploy/"):
        assert (cfg.cluster.service_name, cfg.cluster.namespace) == ("doq", "doq-test")
        assert cfg.logging.mode == "stackdriver"
    else:
        node = where.rsplit(":", 1)[1]
        assert cfg.cluster.node_id == node and cfg.raft.address == f"{node}:{PORTS['raft']}"


def test_validators_are_development_requirements() -> None:
    text = (REPO / "requirements-dev.txt").read_text(encoding="utf-8")
    for name in ("kubernetes-validate", "check-jsonschema"):
        assert re.search(rf"^{name}>=", text, re.M), f"{name} missing from requirements-dev.txt"
