"""The one seam to PySyncObj (L3): every use DOQ makes of its internals, named and checked.

PySyncObj implements Raft in one class, ``SyncObj``, whose state lives in name-mangled
attributes (``_SyncObj__raftCommitIndex``), and one transport, ``TCPTransport``. DOQ replaces
parts of both: the tick (:mod:`~doq_lib.raft.tick`), acknowledgements only of what is on disk
(:mod:`~doq_lib.raft.durability`), the authenticated wire (:mod:`~doq_lib.raft.wire`), a
poller on gevent (:mod:`~doq_lib.raft.poller`) and restricted unpicklers
(:mod:`~doq_lib.raft.codec`). To do so it reads and writes state PySyncObj keeps private,
calls some of its private steps and replaces others. This module is the only one in DOQ that
imports pysyncobj, and it gives each of those a DOQ name:

* :class:`RaftState` (``node.raft``): the private attributes DOQ reads or writes
  (:data:`ATTRIBUTES`) and the private steps it calls (:data:`STEPS`), as typed members.
* :class:`Engine`: ``SyncObj`` whose steps DOQ replaces (:data:`OVERRIDES`) call DOQ-named
  hooks, plus the protected members DOQ uses (:data:`ENGINE_NAMES`).
* :class:`TransportBase`: ``TCPTransport`` the same way (:data:`TRANSPORT_NAMES`).
* :func:`set_journal_factory`, :func:`set_poller_factory`, :func:`set_unpickler`: the
  module-level factories DOQ replaces (:data:`MODULE_NAMES`).
* PySyncObj's public names the other modules use, re-exported.

PySyncObj is pinned exactly (:data:`VERSION`, requirements.txt). tests/core/test_engine.py
checks against the installed package that the version is the pinned one and that every name
listed here exists, and fails naming the ones that are gone; it also checks that no other
module imports pysyncobj or names one of its private members.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import pysyncobj
import pysyncobj.pickle as _pickle
import pysyncobj.syncobj as _syncobj
import pysyncobj.version as _version
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj import replicated as _replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.journal import Journal
from pysyncobj.monotonic import monotonic as _monotonic
from pysyncobj.poller import POLL_EVENT_TYPE, Poller
from pysyncobj.tcp_connection import CONNECTION_STATE, _getAddrType, set_keepalive
from pysyncobj.transport import TCPTransport, TransportNotReadyError

__all__ = [
    "ATTRIBUTES", "CONNECTION_STATE", "ENGINE_NAMES", "FAIL_REASON", "Engine", "Journal",
    "LOGGER", "MODULE_NAMES", "OVERRIDES", "POLL_EVENT_TYPE", "Poller", "RaftState",
    "SERIALIZER_STATE", "STEPS", "SyncObjConf", "TRANSPORT_NAMES", "TransportBase",
    "TransportNotReadyError", "VERSION", "address_family", "globalDnsResolver",
    "installed_version", "missing_names", "monotonic", "replicated", "set_journal_factory",
    "set_keepalive", "set_poller_factory", "set_unpickler",
]

VERSION = "0.3.17"                  # the version these names were read from (requirements.txt)
LOGGER = "pysyncobj.syncobj"        # the logger SyncObj writes to
FOLLOWER, CANDIDATE, LEADER = 0, 1, 2
PRIVATE = "_SyncObj__"              # how Python mangles SyncObj's double-underscore names
T = TypeVar("T")
monotonic: Callable[[], float] = _monotonic   # the clock PySyncObj's deadlines are on
#: marks the SyncObj methods that run on every node once their call is committed
replicated: Callable[[Callable[..., Any]], Callable[..., Any]] = _replicated


def installed_version() -> str:
    return str(_version.VERSION)


def address_family(host: str) -> int:
    """The socket family of a literal address (PySyncObj's choice, so both ends agree)."""
    return int(_getAddrType(host))


# -- SyncObj's private state -------------------------------------------------------------------
class _Private(Generic[T]):
    """One of SyncObj's private attributes, read and written under a DOQ name."""

    __slots__ = ("attribute",)

    def __init__(self, name: str) -> None:
        self.attribute = PRIVATE + name

    def __get__(self, view: RaftState, owner: type | None = None) -> T:
        return getattr(view.node, self.attribute)  # type: ignore[no-any-return]

    def __set__(self, view: RaftState, value: T) -> None:
        setattr(view.node, self.attribute, value)


class _Step:
    """One of SyncObj's private methods, called under a DOQ name."""

    __slots__ = ("attribute",)

    def __init__(self, name: str) -> None:
        self.attribute = PRIVATE + name

    def __get__(self, view: RaftState, owner: type | None = None) -> Callable[..., Any]:
        return getattr(view.node, self.attribute)  # type: ignore[no-any-return]


class RaftState:
    """The Raft state PySyncObj keeps private, as DOQ's tick and transport use it.

    Each member reads (and, for attributes, writes) the node's attribute of the name given
    at its definition; the tables :data:`ATTRIBUTES` and :data:`STEPS` are built from them.
    """

    __slots__ = ("node",)

    def __init__(self, node: SyncObj) -> None:
        self.node = node

    # the node's role and term
    state: _Private[int] = _Private("raftState")                   # FOLLOWER, CANDIDATE, LEADER
    current_term: _Private[int] = _Private("raftCurrentTerm")
    leader: _Private[Any] = _Private("raftLeader")                 # the leader node, or None
    votes_count: _Private[int] = _Private("votesCount")            # votes won as a candidate
    election_deadline: _Private[float] = _Private("raftElectionDeadline")   # monotonic
    transfer_in_progress: _Private[bool] = _Private("transferInProgress")
    # the log and its indexes
    log: _Private[Any] = _Private("raftLog")                       # the journal
    commit_index: _Private[int] = _Private("raftCommitIndex")
    leader_commit_index: _Private[int] = _Private("leaderCommitIndex")   # the leader's, as known
    last_applied: _Private[int] = _Private("raftLastApplied")
    # the leader's view of its followers
    other_nodes: _Private[set[Any]] = _Private("otherNodes")
    connected_nodes: _Private[set[Any]] = _Private("connectedNodes")
    self_node: _Private[Any] = _Private("selfNode")                # None on a read-only node
    next_index: _Private[dict[Any, int]] = _Private("raftNextIndex")
    match_index: _Private[dict[Any, int]] = _Private("raftMatchIndex")
    last_response_time: _Private[dict[Any, float]] = _Private("lastResponseTime")   # monotonic
    next_heartbeat: _Private[float] = _Private("newAppendEntriesTime")   # monotonic
    # commands on their way into the log
    commands_queue: _Private[Any] = _Private("commandsQueue")      # (command, callback) pairs
    waiting_commit: _Private[dict[int, list[Any]]] = _Private("commandsWaitingCommit")
    waiting_reply: _Private[dict[int, Any]] = _Private("commandsWaitingReply")  # forwarded
    # the rest of the tick's bookkeeping
    transport: _Private[Any] = _Private("transport")
    conf: _Private[SyncObjConf] = _Private("conf")
    need_load_dump_file: _Private[bool] = _Private("needLoadDumpFile")
    start_time: _Private[float] = _Private("startTime")
    one_second_timers: _Private[int] = _Private("numOneSecondDumps")
    on_ready_called: _Private[bool] = _Private("onReadyCalled")
    tick_callbacks: _Private[list[Callable[[], None]]] = _Private("onTickCallbacks")
    tick_callbacks_lock: _Private[threading.Lock] = _Private("onTickCallbacksLock")

    # private steps
    last_log_index = _Step("getCurrentLogIndex")            # () -> int
    last_log_term = _Step("getCurrentLogTerm")              # () -> int
    entries = _Step("getEntries")               # (from, count=None) -> [(command, idx, term)]
    set_state = _Step("setState")                           # (state)
    set_current_term = _Step("setCurrentTerm")              # (term, voted_for_node_id)
    random_election_timeout = _Step("generateRaftTimeout")  # () -> seconds
    leader_changed = _Step("onLeaderChanged")               # ()
    become_leader = _Step("onBecomeLeader")                 # ()
    connected_to_anyone = _Step("connectedToAnyone")        # () -> bool
    apply_log_entries = _Step("applyLogEntries")            # ()
    send_append_entries = _Step("sendAppendEntries")        # () to every follower
    parse_change = _Step("parseChangeClusterRequest")       # (command) -> change or None
    change_cluster = _Step("changeCluster")                 # (change) -> accepted
    load_dump_file = _Step("loadDumpFile")                  # (clearJournal)
    try_log_compaction = _Step("tryLogCompaction")          # ()


ATTRIBUTES: dict[str, str] = {name: member.attribute for name, member in vars(RaftState).items()
                              if isinstance(member, _Private)}
STEPS: dict[str, str] = {name: member.attribute for name, member in vars(RaftState).items()
                         if isinstance(member, _Step)}


# -- SyncObj's steps DOQ replaces --------------------------------------------------------------
class Engine(SyncObj):  # type: ignore[misc]  # PySyncObj has no annotations
    """``SyncObj`` whose replaceable steps call DOQ-named hooks (defaults: PySyncObj's own)."""

    raft: RaftState

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.raft = RaftState(self)
        super().__init__(*args, **kwargs)
        gone = missing_names(self)
        if gone:
            raise RuntimeError(
                f"PySyncObj {installed_version()} lacks what DOQ uses of it (read from "
                f"{VERSION}, the version requirements.txt pins): {', '.join(gone)}")

    # hooks
    def tick(self, time_to_wait: float) -> None:
        """One tick, then the poll (PySyncObj: ``_onTick``)."""
        SyncObj._onTick(self, time_to_wait)

    def take_commands(self) -> None:
        """Queued commands into the log, or to the leader (``_checkCommandsToApply``)."""
        SyncObj._checkCommandsToApply(self)

    def queue_command(self, command: bytes, callback: Any, command_type: Any) -> None:
        """A command proposed here or forwarded by a follower, into the queue
        (``_applyCommand``); ``callback`` is a tuple (node, request id) when forwarded."""
        SyncObj._applyCommand(self, command, callback, command_type)

    def apply_command(self, command: bytes) -> Any:
        """Apply one committed log entry (``__doApplyCommand``)."""
        return getattr(SyncObj, PRIVATE + "doApplyCommand")(self, command)

    # PySyncObj's names for them
    def _onTick(self, timeToWait: float = 0.0) -> None:
        self.tick(timeToWait)

    def _checkCommandsToApply(self) -> None:
        self.take_commands()

    def _applyCommand(self, command: bytes, callback: Any, commandType: Any = None) -> None:
        self.queue_command(command, callback, commandType)

    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:
        return self.apply_command(command)

    # protected members DOQ uses
    @property
    def poller(self) -> Any:
        return self._poller

    def leads(self) -> bool:
        return bool(self._isLeader())

    def leader_node(self) -> Any:
        """The last leader this node heard of, or None."""
        return self._getLeader()

    def method_id(self, prefix: str) -> int:
        """The wire id of the replicated method whose name starts with ``prefix``."""
        return next(int(id_) for name, id_ in self._methodToID.items()
                    if str(name).startswith(prefix))

    def destroy_now(self) -> None:
        """Stop at once, in this thread (``_doDestroy``; ``destroy`` defers to the tick)."""
        self._doDestroy()


OVERRIDES = ("_onTick", "_checkCommandsToApply", "_applyCommand", PRIVATE + "doApplyCommand")
ENGINE_NAMES = ("_poller", "_isLeader", "_getLeader", "_methodToID", "_doDestroy")


# -- TCPTransport ------------------------------------------------------------------------------
class TransportBase(TCPTransport):  # type: ignore[misc]  # (no annotations)
    """``TCPTransport`` with its protected members under DOQ names.

    Steps DOQ replaces: :meth:`create_server`, :meth:`incoming_connection`,
    :meth:`introduction`, :meth:`message_received`. Steps it calls: :meth:`outgoing_connected`,
    :meth:`disconnected`, :meth:`node_connected`, :meth:`should_connect`."""

    # state
    @property
    def raft_node(self) -> Any:
        """The SyncObj this transport serves."""
        return self._syncObj

    @property
    def connections(self) -> dict[Any, Any]:
        """Member node -> its connection."""
        return self._connections  # type: ignore[no-any-return]

    @property
    def unknown_connections(self) -> set[Any]:
        """Accepted connections that have not yet said which member they are."""
        return self._unknownConnections  # type: ignore[no-any-return]

    @property
    def nodes(self) -> set[Any]:
        return self._nodes  # type: ignore[no-any-return]

    @property
    def node_by_address(self) -> dict[str, Any]:
        return self._nodeAddrToNode  # type: ignore[no-any-return]

    # hooks (defaults: PySyncObj's own)
    def create_server(self) -> Any:
        """The listening server; PySyncObj binds it later."""
        TCPTransport._createServer(self)
        return self._server

    def incoming_connection(self, conn: Any) -> None:
        TCPTransport._onNewIncomingConnection(self, conn)

    def introduction(self, conn: Any, message: Any) -> None:
        """An accepted connection's first message: the address of the member calling."""
        TCPTransport._onIncomingMessageReceived(self, conn, message)

    def message_received(self, node: Any, message: Any) -> None:
        """A message from member ``node``, handed to the SyncObj."""
        TCPTransport._onMessageReceived(self, node, message)

    # steps DOQ calls
    def should_connect(self, node: Any) -> bool:
        """Whether this node calls ``node`` (the greater address calls the smaller)."""
        return bool(self._shouldConnect(node))

    def outgoing_connected(self, conn: Any) -> None:
        self._onOutgoingConnected(conn)

    def disconnected(self, conn: Any) -> None:
        self._onDisconnected(conn)

    def node_connected(self, node: Any) -> None:
        self._onNodeConnected(node)

    # PySyncObj's names for the hooks
    def _createServer(self) -> None:
        self._server = self.create_server()

    def _onNewIncomingConnection(self, conn: Any) -> None:
        self.incoming_connection(conn)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        self.introduction(conn, message)

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        self.message_received(node, message)


TRANSPORT_NAMES = (
    "_syncObj", "_server", "_connections", "_unknownConnections", "_nodes", "_nodeAddrToNode",
    "_createServer", "_onNewIncomingConnection", "_onIncomingMessageReceived",
    "_onMessageReceived", "_shouldConnect", "_onOutgoingConnected", "_onDisconnected",
    "_onNodeConnected",
)


# -- module-level factories --------------------------------------------------------------------
_original_journal = _syncobj.createJournal


def set_journal_factory(factory: Callable[[str | None, Callable[[str | None], Any]], Any]) -> None:
    """SyncObj builds its journal with ``factory(path, pysyncobj_factory)`` from now on."""
    _syncobj.createJournal = lambda path=None: factory(path, _original_journal)


def set_poller_factory(factory: Callable[[], Poller]) -> None:
    """Every SyncObj created from now on polls with ``factory()``."""
    _syncobj.createPoller = lambda poller_type: factory()


def set_unpickler(loads: Callable[[Any], Any], load: Callable[[Any], Any],
                  protocol: int) -> None:
    """Route PySyncObj's unpickling (commands, membership changes, snapshot files) through
    ``loads`` and ``load``, and its pickling through ``protocol``."""
    vars(_pickle)["__protocol"] = protocol
    _pickle.loads = loads
    _pickle.load = load


MODULE_NAMES = (
    (_syncobj, "createJournal"), (_syncobj, "createPoller"),
    (_pickle, "loads"), (_pickle, "load"), (_pickle, "__protocol"),
    (pysyncobj.tcp_connection, "_getAddrType"),
)


def missing_names(node: SyncObj) -> list[str]:
    """The names this module lists that PySyncObj lacks: on ``node`` (a SyncObj after its
    ``__init__``) or its class, its transport or that transport's class, its modules. Empty
    when the seam fits the installed version. DOQ's own overrides do not count as present."""
    def has(obj: Any, cls: type, name: str) -> bool:
        return hasattr(cls, name) or name in vars(obj)

    gone = [f"SyncObj.{name}" for name in [*ATTRIBUTES.values(), *STEPS.values(),
                                            *OVERRIDES, *ENGINE_NAMES]
            if not has(node, SyncObj, name)]
    transport = getattr(node, PRIVATE + "transport", None)
    gone += [f"TCPTransport.{name}" for name in TRANSPORT_NAMES
             if not isinstance(transport, TCPTransport) or not has(transport, TCPTransport, name)]
    gone += [f"{module.__name__}.{name}" for module, name in MODULE_NAMES
             if name not in vars(module)]
    return gone
