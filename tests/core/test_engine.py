"""The seam to PySyncObj (doq_lib/raft/engine.py): pinned, complete, the only way in.

These run against the installed PySyncObj: an upgrade that renames or drops something DOQ
uses fails here, naming it, before any cluster test starts."""
from __future__ import annotations

import ast
import inspect
import os
import re
import socket
import textwrap
from collections.abc import Iterator

import pytest
from pysyncobj import SyncObj, SyncObjConf

from doq_lib.raft import engine
from doq_lib.raft.engine import Engine, RaftState

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def plain_node() -> Iterator[SyncObj]:
    """PySyncObj's own SyncObj, as the installed version builds it (no tick runs)."""
    node = SyncObj(free_address(), [], SyncObjConf(autoTick=False))
    try:
        yield node
    finally:
        node._doDestroy()


def test_the_installed_pysyncobj_is_the_pinned_one() -> None:
    with open(os.path.join(REPO, "requirements.txt"), encoding="utf-8") as f:
        pins = re.findall(r"^pysyncobj==(\S+)", f.read(), re.M)
    assert pins == [engine.VERSION], "requirements.txt must pin pysyncobj to engine.VERSION"
    assert engine.installed_version() == engine.VERSION, (
        f"PySyncObj {engine.installed_version()} is installed; doq_lib/raft/engine.py was "
        f"read from {engine.VERSION}")


def test_every_name_the_seam_lists_exists_in_the_installed_pysyncobj(plain_node: SyncObj) -> None:
    assert engine.missing_names(plain_node) == [], \
        "PySyncObj changed: re-read what doq_lib/raft/engine.py lists for these names"


def test_a_name_gone_from_pysyncobj_is_named(plain_node: SyncObj,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(plain_node, "_SyncObj__raftMatchIndex")
    monkeypatch.delattr(SyncObj, "_SyncObj__sendAppendEntries")
    transport = plain_node._SyncObj__transport      # type: ignore[attr-defined]
    monkeypatch.delattr(transport, "_nodeAddrToNode")
    assert engine.missing_names(plain_node) == [
        "SyncObj._SyncObj__raftMatchIndex", "SyncObj._SyncObj__sendAppendEntries",
        "TCPTransport._nodeAddrToNode"]


def test_an_engine_refuses_to_start_on_a_pysyncobj_without_a_listed_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(SyncObj, "_SyncObj__tryLogCompaction")
    with pytest.raises(RuntimeError) as caught:
        Engine(free_address(), [], SyncObjConf(autoTick=False))
    assert "SyncObj._SyncObj__tryLogCompaction" in str(caught.value)
    assert f"read from {engine.VERSION}" in str(caught.value)


def test_the_state_view_reads_and_writes_the_private_attributes(plain_node: SyncObj) -> None:
    raft = RaftState(plain_node)
    assert raft.state == engine.FOLLOWER
    assert raft.commit_index == plain_node.raftCommitIndex
    raft.election_deadline = 123.5
    assert plain_node._SyncObj__raftElectionDeadline == 123.5   # type: ignore[attr-defined]
    assert raft.last_log_index() == plain_node._SyncObj__getCurrentLogIndex()  # type: ignore[attr-defined]
    assert raft.transport is plain_node._SyncObj__transport     # type: ignore[attr-defined]
    assert raft.match_index is plain_node._SyncObj__raftMatchIndex  # type: ignore[attr-defined]
    assert engine.BOUND["match_index"] == "_SyncObj__raftMatchIndex"
    assert engine.STEPS["entries"] == "_SyncObj__getEntries"


def test_what_the_view_keeps_is_bound_only_when_a_syncobj_is_built() -> None:
    """BOUND members are read once, when the view is made: that holds only while SyncObj
    assigns each of them in its __init__ alone (in its source: ``self.__name = ...``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(SyncObj)))
    elsewhere = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef) or function.name == "__init__":
            continue
        for node in ast.walk(function):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            elsewhere += [f"{function.name}: {t.attr}" for t in targets
                          if isinstance(t, ast.Attribute) and
                          engine.PRIVATE + t.attr.removeprefix("__") in engine.BOUND.values()]
    assert elsewhere == [], "move these from BOUND to RaftState's properties"
    rebound = {"_SyncObj__" + name for name in ("otherNodes", "commandsWaitingReply")}
    assert rebound <= set(engine.ATTRIBUTES.values())       # the two SyncObj does rebind


def test_a_subclass_hook_is_what_pysyncobj_calls() -> None:
    class Ticking(Engine):
        def tick(self, time_to_wait: float) -> None:
            pass

    assert Ticking._onTick is Ticking.tick
    assert Ticking._checkCommandsToApply is Engine.take_commands


def test_the_hooks_reach_pysyncobj_steps_by_default() -> None:
    """An Engine that overrides nothing ticks, elects and queues as PySyncObj does."""
    node = Engine(free_address(), [], SyncObjConf(autoTick=False))
    try:
        for _ in range(50):                       # the transport binds, then an election
            node.raft.election_deadline = 0.0
            node.tick(0.01)
            if node.raft.state == engine.LEADER:
                break
        assert node.raft.state == engine.LEADER      # a one-node cluster elects itself
        assert node.leader_node() is not None
        before = node.raft.last_log_index()
        node.queue_command(b"\x00" + b"x", None, None)
        node.take_commands()
        assert node.raft.last_log_index() == before + 1
    finally:
        node.destroy_now()


def _pysyncobj_users() -> Iterator[tuple[str, str]]:
    for folder, _, files in os.walk(os.path.join(REPO, "doq_lib")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, REPO), f.read()


def _imports(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_the_seam_imports_pysyncobj() -> None:
    importers = sorted(path for path, source in _pysyncobj_users()
                       if any(n.split(".")[0] == "pysyncobj" for n in _imports(source)))
    assert importers == ["doq_lib/raft/engine.py"]


def _own_attributes(source: str) -> set[str]:
    """Attributes a module sets on its own objects (``self._x = ...``)."""
    return {target.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Attribute)}


def test_no_other_module_names_a_pysyncobj_internal() -> None:
    internal = {*engine.ENGINE_NAMES, *engine.TRANSPORT_NAMES, *engine.OVERRIDES}
    problems = []
    for path, source in _pysyncobj_users():
        if path == "doq_lib/raft/engine.py":
            continue
        if "_SyncObj__" in source or "_PipeNotifier__" in source:
            problems.append(f"{path}: a mangled PySyncObj name")
        own = _own_attributes(source)
        for node in ast.walk(ast.parse(source)):
            name = node.attr if isinstance(node, ast.Attribute) else \
                node.name if isinstance(node, ast.FunctionDef) else None
            if name in internal and name not in own:
                problems.append(f"{path}:{getattr(node, 'lineno', 0)}: {name}")
    assert problems == [], "use doq_lib/raft/engine.py's names instead"

