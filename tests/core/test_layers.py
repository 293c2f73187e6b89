"""The layer map of docs/ARCHITECTURE.md: imports inside doq_lib point down only, transports never
import each other, pysyncobj is imported only by doq_lib/raft/; inside each package and tui/
modules import down their own map too. And the house rules that keep the code readable: no
private name used from another module, one class per name, only files the repository holds
cited, the architecture picture equal to the map."""
from __future__ import annotations

import ast
import os
import re
import subprocess

import pytest

from tests.harness import REPO

LIB = os.path.join(REPO, "doq_lib")
LAYERS = {
    "errors": 0, "failures": 0, "rules": 0, "models": 0, "config": 0, "secret": 0, "auth": 0,
    "log": 0, "sockets": 0, "metrics": 0, "ids": 0, "clock": 0, "tls": 0, "schedules": 0,
    "usage": 0,
    "store": 1, "lmdb_store": 1, "diskspace": 1,
    "queues": 2,
    "raft": 3, "fsm": 3, "commands": 3,
    "service": 4, "scheduler": 4, "backup": 4, "backup_check": 4, "backup_jobs": 4,
    "cluster": 4, "k8s": 4,
    "http": 5, "grpc": 5,
    "server": 6, "admin": 6, "certs": 6,
    "client": 0, "pb": 0, "tasks": 0, "worker": 0, "worker_processes": 0,
    "integrations": 0, "tracing": 0, "worker_acks": 0, "worker_metrics": 0,
}
TRANSPORTS = {"http", "grpc"}
SAME_LAYER_ALLOWED = {("service", "backup"), ("service", "scheduler"), ("backup", "backup_check")}


def _module_of(path: str) -> str:
    rel = os.path.relpath(path, LIB)
    return rel.split(os.sep)[0].removesuffix(".py")


def _imports(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
    return found


def _python_files(*tops: str) -> list[str]:
    out = []
    for top in tops:
        path = os.path.join(REPO, top)
        if path.endswith(".py"):
            out.append(path)
            continue
        for root, _, files in os.walk(path):
            out.extend(os.path.join(root, f) for f in files if f.endswith(".py"))
    return sorted(out)


def _sources() -> list[str]:
    return _python_files("doq_lib")


def test_every_module_has_a_layer() -> None:
    unknown = {_module_of(p) for p in _sources()} - set(LAYERS) - {"__init__"}
    assert not unknown, f"add these modules to the layer map: {unknown}"


def violations(me: str, imports: list[str]) -> list[str]:
    problems = []
    for name in imports:
        if name.startswith("pysyncobj") and me != "raft":
            problems.append(f"only doq_lib/raft may import pysyncobj ({name})")
        if not name.startswith("doq_lib."):
            continue
        target = name.split(".")[1]
        if target == me or (me, target) in SAME_LAYER_ALLOWED:
            continue
        down = LAYERS[target] < LAYERS[me]
        sideways_ok = LAYERS[target] == LAYERS[me] and TRANSPORTS.isdisjoint({me, target})
        if not (down or sideways_ok):
            problems.append(f"{name} (layer {LAYERS[target]}) from layer {LAYERS[me]}")
        if me == "client" and LAYERS[target] != 0:
            problems.append(f"the client may import only layer 0 ({name})")
    return problems


@pytest.mark.parametrize("path", _sources(), ids=lambda p: os.path.relpath(p, REPO))
def test_imports_point_down(path: str) -> None:
    me = _module_of(path)
    if me != "__init__":
        assert violations(me, _imports(path)) == []


@pytest.mark.parametrize(("me", "imported"), [
    ("fsm", "doq_lib.service"), ("queues", "doq_lib.fsm"), ("http", "doq_lib.grpc.api"),
    ("service", "pysyncobj"), ("client", "doq_lib.service"), ("store", "doq_lib.queues.fair"),
])
def test_the_checker_catches_bad_imports(me: str, imported: str) -> None:
    assert violations(me, [imported]), f"{me} importing {imported} should be refused"


MAX_LINES = 600
GENERATED = os.path.join(LIB, "pb")


def _all_modules() -> list[str]:
    out = [p for p in _sources() if not p.startswith(GENERATED + os.sep)]
    tui = os.path.join(REPO, "tui")
    out.extend(os.path.join(tui, f) for f in sorted(os.listdir(tui)) if f.endswith(".py"))
    return out


def test_no_module_passes_600_lines() -> None:
    long = {}
    for path in _all_modules():
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            long[os.path.relpath(path, REPO)] = lines
    assert not long, f"split these modules (at most {MAX_LINES} lines each): {long}"


HTTP_CONNECTIONS = {"HTTPConnection", "HTTPSConnection", "urlopen"}


def test_http_requests_are_made_only_by_the_client_transport() -> None:
    """One HTTP client: every request DOQ makes (client, console, cluster calls, Kubernetes)
    goes through doq_lib/client/ (its transport.py opens the connections)."""
    allowed = os.path.join(LIB, "client") + os.sep
    found = []
    for path in _all_modules():
        if path.startswith(allowed):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else \
                node.id if isinstance(node, ast.Name) else None
            if name in HTTP_CONNECTIONS:
                found.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {name}")
    assert not found, f"make these requests through doq_lib.client.Transport: {found}"


def private_imports(source: str) -> list[str]:
    """``from doq_lib.x import _name`` (or tui's, or doq's) in ``source``: a name its owner
    keeps to itself, used from outside."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] in ("doq_lib", "tui", "doq"):
            found.extend(f"{node.module}.{alias.name}" for alias in node.names
                         if alias.name.startswith("_") and not alias.name.startswith("__"))
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    """Private means private: a helper other modules use gets a public name where it lives."""
    problems = []
    for path in _python_files("doq_lib", "tui", "doq.py", "tests", "scripts"):
        with open(path, encoding="utf-8") as f:
            problems += [f"{os.path.relpath(path, REPO)}: {name}"
                         for name in private_imports(f.read())]
    assert not problems, problems


def test_the_private_import_check_catches_one() -> None:
    assert private_imports("from doq_lib.http.calls import reply, _hidden\n") == [
        "doq_lib.http.calls._hidden"]
    assert private_imports("from os import _exit\nfrom doq_lib import __version__\n") == []


#: Class names that exist twice on purpose, each with one side users write: the task API's
#: ``Call`` (doq_lib/tasks.py; the HTTP layer's request is the other), and ``Transport``
#: (kombu finds a transport module's ``Transport`` by that name; the client's is the other).
SHARED_CLASS_NAMES = {"Call", "Transport"}


def test_class_names_are_unique() -> None:
    """One name, one class: reading ``Malformed`` or ``MemberInfo`` needs no guess at which."""
    seen: dict[str, list[str]] = {}
    for path in _python_files("doq_lib", "tui"):
        with open(path, encoding="utf-8") as f:
            for node in ast.parse(f.read()).body:
                if isinstance(node, ast.ClassDef):
                    seen.setdefault(node.name, []).append(os.path.relpath(path, REPO))
    twice = {name: where for name, where in seen.items()
             if len(where) > 1 and name not in SHARED_CLASS_NAMES}
    assert not twice, twice


def test_no_class_is_assembled_from_project_classes() -> None:
    """Composition, not mixins: a class of the project extends at most one other of the
    project's classes, and nothing grafts methods onto a class from outside its body."""
    classes: dict[str, list[ast.ClassDef]] = {}
    sources = {}
    for path in _python_files("doq_lib", "tui"):
        with open(path, encoding="utf-8") as f:
            sources[os.path.relpath(path, REPO)] = tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(node)
    mixed, grafted = [], []
    for path, tree in sources.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                own = [ast.unparse(b) for b in node.bases
                       if ast.unparse(b).rsplit(".", 1)[-1] in classes]
                if len(own) > 1:
                    mixed.append(f"{path}: {node.name}({', '.join(own)})")
        for node in tree.body:                     # module level: setattr(SomeClass, ...)
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and ast.unparse(call.func) == "setattr" and \
                        call.args and ast.unparse(call.args[0]) in classes:
                    grafted.append(f"{path}:{call.lineno}")
    assert mixed == [] and grafted == [], {"mixed": mixed, "grafted": grafted}


_ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")     # the tracker is not part of the repository
_DOC = re.compile(r"(?<![\w./%-])([\w./-]*[A-Za-z]\.md)\b")
_MODULE = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.py)\b")
#: Where a module path may be rooted when a text names it package-relative (raft/tick.py).
_ROOTS = ("", "doq_lib", "tests", "scripts", "scripts/bench")


def missing_references(name: str, text: str, tracked: set[str]) -> list[str]:
    """Documents (``*.md``) and module paths (``dir/x.py``) that ``text`` (the file
    ``name``) names and the repository does not hold."""
    here = os.path.dirname(name)
    names = {os.path.basename(path) for path in tracked}
    out = []
    for ref in _DOC.findall(text):
        if ref.startswith("../shared/"):               # the shared benchmark harness
            continue
        if not ({os.path.normpath(os.path.join(here, ref)), ref} & tracked) and \
                not ("/" not in ref and ref in names):
            out.append(ref)
    if name == "docs/BENCHMARKS.md":                   # a dated record of code that was
        return out
    out += [f"an issue number ({ref})" for ref in _ISSUE.findall(text)]
    for ref in _MODULE.findall(text):
        candidates = {os.path.normpath(os.path.join(here, ref))} | {
            os.path.normpath(os.path.join(root, ref)) for root in _ROOTS}
        if not candidates & tracked and not ref.startswith("../"):
            out.append(ref)
    return out


def test_the_project_cites_only_files_it_holds() -> None:
    """Code, tests and docs name documents and modules of this repository only: no design
    notes kept elsewhere, no module that was renamed or removed, no issue of a tracker."""
    done = subprocess.run(["git", "-C", REPO, "ls-files"], capture_output=True, text=True,
                          check=True)
    tracked = set(done.stdout.split())
    problems = []
    for name in sorted(tracked):
        if not name.endswith((".py", ".md", ".txt", ".sh", ".toml", ".yml", ".yaml")) or \
                name.startswith(("doq_lib/pb/", "webui/assets/vendor/")) or \
                name == "tests/core/test_layers.py":           # its examples of missing ones
            continue
        with open(os.path.join(REPO, name), encoding="utf-8", errors="replace") as f:
            problems += [f"{name}: {ref}" for ref in missing_references(name, f.read(), tracked)]
    assert not problems, problems


def test_the_reference_check_catches_a_missing_file() -> None:
    tracked = {"docs/ARCHITECTURE.md", "doq_lib/raft/tick.py", "README.md"}
    text = ("see DESIGN.md §2, docs/ARCHITECTURE.md, raft/tick.py and doq_lib/http_api.py "
            "(issue 17)")
    assert missing_references("doq_lib/x.py", text, tracked) == [
        "DESIGN.md", "an issue number (issue 17)", "doq_lib/http_api.py"]


def layer_picture(text: str) -> dict[str, int]:
    """The modules of docs/ARCHITECTURE.md's layer picture (the first code block), by layer:
    a line ``Ln a.py b/ ...`` and the lines under it list modules until the description."""
    block = text.split("```\n", 2)[1]
    out: dict[str, int] = {}
    layer = -1
    for line in block.splitlines():
        words = line.split()
        if words and re.fullmatch(r"L\d", words[0]):
            layer, words = int(words[0][1]), words[1:]
        elif not line.startswith("   "):
            continue
        for word in words:
            if not word.endswith((".py", "/")):
                break
            out[word.removesuffix(".py").removesuffix("/")] = layer
    return out


def test_the_architecture_picture_places_every_module_as_the_map_does() -> None:
    with open(os.path.join(REPO, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        picture = layer_picture(f.read())
    assert picture == LAYERS, {
        "missing from the picture": sorted(set(LAYERS) - set(picture)),
        "not in the map": sorted(set(picture) - set(LAYERS)),
        "elsewhere": sorted(k for k in set(LAYERS) & set(picture) if LAYERS[k] != picture[k])}


#: The layers inside each package (and tui/): a module imports only modules of its package
#: on a lower layer, at run time (``if TYPE_CHECKING:`` imports, for annotations, may point
#: anywhere). A new module gets its place here.
PACKAGE_LAYERS: dict[str, dict[str, int]] = {
    "doq_lib/raft": {"aio": 0, "engine": 0, "pipeline": 0, "proposer": 0, "syncer": 0,
                     "codec": 1, "poller": 1, "tick": 1, "secure": 2, "wire": 3,
                     "durability": 4, "net": 4, "snapshot": 5, "node": 6},
    "doq_lib/fsm": {"state": 0, "base": 1, "consumers": 1, "lifecycle": 2, "limits": 2,
                    "membership": 2, "restore": 2, "schedules": 2, "controls": 3, "inspect": 3,
                    "messages": 3, "queues": 3, "machine": 4},
    "doq_lib/http": {"auth": 0, "calls": 0, "framing": 0, "schema": 0, "openapi": 1,
                     "parsing": 1, "server": 1, "controls": 2, "schedules": 2, "api": 3,
                     "app": 4},
    "doq_lib/grpc": {"requests": 0, "streams": 1, "controls": 2, "api": 3, "calls": 4,
                     "connection": 5, "server": 6},
    "doq_lib/queues": {"base": 0, "stats": 0, "delayed": 1, "fair_order": 1, "weighted": 1,
                       "fair": 2},
    "doq_lib/client": {"calls": 0, "delivered": 0, "schedules": 0, "transport": 0,
                       "common": 1, "http_calls": 2, "rpc_calls": 2, "subscriptions": 3,
                       "aio_consumers": 4, "rest": 4, "aio": 5, "rpc": 5},
    "doq_lib/config": {"checks": 0, "schema": 1, "load": 2},
    "doq_lib/integrations": {"celery": 0, "django": 0},
    "tui": {"backend": 0, "widgets": 0, "cluster": 1, "controls": 1, "screens": 2, "app": 3},
}


def runtime_imports(source: str) -> list[str]:
    """The modules ``source`` imports when it runs (not those under ``if TYPE_CHECKING:``),
    with ``from a import b`` also giving ``a.b`` (b may be a module)."""
    tree = ast.parse(source)
    typing_only = {id(node) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and getattr(
                       block.test, "id", getattr(block.test, "attr", "")) == "TYPE_CHECKING"
                   for stmt in block.body for node in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def package_violations(package: str, me: str, imports: list[str]) -> list[str]:
    layers = PACKAGE_LAYERS[package]
    prefix = package.replace("/", ".") + "."
    problems = []
    for name in imports:
        if not name.startswith(prefix):
            continue
        target = name[len(prefix):].split(".")[0]
        if target == me or target not in layers:
            continue
        if layers[target] >= layers[me]:
            problems.append(f"{package}/{me} (layer {layers[me]}) imports {target} "
                            f"(layer {layers[target]})")
    return sorted(set(problems))


@pytest.mark.parametrize("package", sorted(PACKAGE_LAYERS))
def test_modules_inside_a_package_import_down_only(package: str) -> None:
    folder = os.path.join(REPO, package)
    modules = {f.removesuffix(".py") for f in os.listdir(folder)
               if f.endswith(".py") and f != "__init__.py"}
    assert modules == set(PACKAGE_LAYERS[package]), \
        f"place these modules in PACKAGE_LAYERS[{package!r}]: " \
        f"{sorted(modules ^ set(PACKAGE_LAYERS[package]))}"
    problems = []
    for module in sorted(modules):
        with open(os.path.join(folder, module + ".py"), encoding="utf-8") as f:
            problems += package_violations(package, module, runtime_imports(f.read()))
    assert not problems, problems


def test_the_package_check_catches_an_upward_import() -> None:
    source = ("from typing import TYPE_CHECKING\nfrom doq_lib.raft.node import RaftNode\n"
              "if TYPE_CHECKING:\n    from doq_lib.raft.proposer import RaftProposer\n")
    assert package_violations("doq_lib/raft", "tick", runtime_imports(source)) == [
        "doq_lib/raft/tick (layer 1) imports node (layer 6)"]
