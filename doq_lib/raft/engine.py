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
  (:data:`ATTRIBUTES`, :data:`BOUND`) and the private steps it calls (:data:`STEPS`), as
  typed members.
* :class:`Engine`: ``SyncObj`` whose steps DOQ replaces are hooks with DOQ names
  (:data:`OVERRIDES`), plus the protected members DOQ uses (:data:`ENGINE_NAMES`).
* :class:`TransportBase`: ``TCPTransport`` the same way (:data:`TRANSPORT_HOOKS`,
  :data:`TRANSPORT_NAMES`).
* :func:`set_journal_factory`, :func:`set_poller_factory`, :func:`set_unpickler`: the
  module-level factories DOQ replaces (:data:`MODULE_NAMES`).
* PySyncObj's public names the other modules use, re-exported.

PySyncObj is pinned exactly (:data:`VERSION`, requirements.txt). tests/core/test_engine.py
checks against the installed package that the version is the pinned one and that every name
listed here exists, and fails naming the ones that are gone; that what :class:`RaftState`
keeps as plain attributes is assigned only in SyncObj's ``__init__``; and that no other module
imports pysyncobj or names one of its private members.
"""
from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

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
    "ATTRIBUTES", "BOUND", "CONNECTION_STATE", "ENGINE_NAMES", "FAIL_REASON", "Engine",
    "Journal", "LOGGER", "MODULE_NAMES", "OVERRIDES", "POLL_EVENT_TYPE", "Poller", "RaftState",
    "SERIALIZER_STATE", "STEPS", "SyncObjConf", "TRANSPORT_HOOKS", "TRANSPORT_NAMES",
    "TransportBase", "TransportNotReadyError", "VERSION", "address_family", "globalDnsResolver",
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
class _Private(property, Generic[T]):
    """One of SyncObj's private attributes, read and written under a DOQ name.

    A ``property`` whose getter is an ``operator.attrgetter``: a read runs no Python frame
    (the tick reads these a few dozen times per tick, on every node)."""

    def __init__(self, name: str) -> None:
        attribute = PRIVATE + name

        def write(view: RaftState, value: T) -> None:
            setattr(view.node, attribute, value)

        super().__init__(operator.attrgetter("node." + attribute), write)
        self.attribute = attribute

    if TYPE_CHECKING:              # how mypy sees it: the attribute's own type
        def __get__(self, view: object, owner: type | None = None) -> T: ...  # type: ignore[override]

        def __set__(self, view: object, value: T) -> None: ...


class RaftState:
    """The Raft state PySyncObj keeps private, as DOQ's tick and transport use it.

    Three kinds of member, each listed with the private name it stands for:

    * values SyncObj rebinds as it runs (term, indexes, deadlines): properties that read and
      write the node's attribute (:data:`ATTRIBUTES`);
    * objects SyncObj binds once, in its ``__init__`` (the configuration, the journal, the
      per-follower dicts): kept here as plain attributes (:data:`BOUND`), so the tick reads
      them as cheaply as the node's own;
    * private steps: kept as bound methods (:data:`STEPS`).
    """

    # bound once (BOUND)
    conf: SyncObjConf
    transport: Any
    self_node: Any                          # None on a read-only node
    log: Any                                # the journal
    connected_nodes: set[Any]
    next_index: dict[Any, int]
    match_index: dict[Any, int]
    last_response_time: dict[Any, float]    # monotonic
    commands_queue: Any                     # (command, callback) pairs
    waiting_commit: dict[int, list[Any]]    # index -> [(term, callback)]
    tick_callbacks: list[Callable[[], None]]
    tick_callbacks_lock: threading.Lock
    start_time: float                       # monotonic, when the node was built
    poller: Any                             # SyncObj's poller (protected, bound once too)
    # private steps (STEPS)
    last_log_index: Callable[[], int]
    last_log_term: Callable[[], int]
    entries: Callable[..., list[tuple[bytes, int, int]]]   # (from, count=None): (cmd, idx, term)
    set_state: Callable[[int], None]
    set_current_term: Callable[[int, Any], None]           # (term, voted-for node id)
    random_election_timeout: Callable[[], float]
    leader_changed: Callable[[], None]
    become_leader: Callable[[], None]
    connected_to_anyone: Callable[[], bool]
    apply_log_entries: Callable[[], None]
    send_append_entries: Callable[[], None]                # to every follower
    parse_change: Callable[[bytes], Any]                   # a membership change, or None
    change_cluster: Callable[[Any], bool]                  # whether it was accepted
    load_dump_file: Callable[..., None]                    # (clearJournal)
    try_log_compaction: Callable[[], None]

    # rebound as it runs (ATTRIBUTES)
    state: _Private[int] = _Private("raftState")                   # FOLLOWER, CANDIDATE, LEADER
    current_term: _Private[int] = _Private("raftCurrentTerm")
    leader: _Private[Any] = _Private("raftLeader")                 # the leader node, or None
    votes_count: _Private[int] = _Private("votesCount")            # votes won as a candidate
    election_deadline: _Private[float] = _Private("raftElectionDeadline")   # monotonic
    transfer_in_progress: _Private[bool] = _Private("transferInProgress")
    commit_index: _Private[int] = _Private("raftCommitIndex")
    leader_commit_index: _Private[int] = _Private("leaderCommitIndex")   # the leader's, as known
    last_applied: _Private[int] = _Private("raftLastApplied")
    other_nodes: _Private[set[Any]] = _Private("otherNodes")       # rebound on a change
    next_heartbeat: _Private[float] = _Private("newAppendEntriesTime")   # monotonic
    waiting_reply: _Private[dict[int, Any]] = _Private("commandsWaitingReply")  # forwarded
    need_load_dump_file: _Private[bool] = _Private("needLoadDumpFile")
    one_second_timers: _Private[int] = _Private("numOneSecondDumps")
    on_ready_called: _Private[bool] = _Private("onReadyCalled")

    def __init__(self, node: SyncObj) -> None:
        """``node`` after SyncObj's ``__init__``."""
        self.node = node
        for name, attribute in {**BOUND, **STEPS}.items():
            setattr(self, name, getattr(node, attribute))
        self.poller = node._poller


BOUND: dict[str, str] = {name: PRIVATE + private for name, private in (
    ("conf", "conf"), ("transport", "transport"), ("self_node", "selfNode"),
    ("log", "raftLog"), ("connected_nodes", "connectedNodes"), ("next_index", "raftNextIndex"),
    ("match_index", "raftMatchIndex"), ("last_response_time", "lastResponseTime"),
    ("commands_queue", "commandsQueue"), ("waiting_commit", "commandsWaitingCommit"),
    ("tick_callbacks", "onTickCallbacks"), ("tick_callbacks_lock", "onTickCallbacksLock"),
    ("start_time", "startTime"))}
STEPS: dict[str, str] = {name: PRIVATE + private for name, private in (
    ("last_log_index", "getCurrentLogIndex"), ("last_log_term", "getCurrentLogTerm"),
    ("entries", "getEntries"), ("set_state", "setState"),
    ("set_current_term", "setCurrentTerm"), ("random_election_timeout", "generateRaftTimeout"),
    ("leader_changed", "onLeaderChanged"), ("become_leader", "onBecomeLeader"),
    ("connected_to_anyone", "connectedToAnyone"), ("apply_log_entries", "applyLogEntries"),
    ("send_append_entries", "sendAppendEntries"), ("parse_change", "parseChangeClusterRequest"),
    ("change_cluster", "changeCluster"), ("load_dump_file", "loadDumpFile"),
    ("try_log_compaction", "tryLogCompaction"))}
ATTRIBUTES: dict[str, str] = {name: member.attribute for name, member in vars(RaftState).items()
                              if isinstance(member, _Private)}


# -- SyncObj's steps DOQ replaces --------------------------------------------------------------
class Engine(SyncObj):  # type: ignore[misc]  # PySyncObj has no annotations
    """``SyncObj`` whose replaceable steps have DOQ names (hooks).

    In a subclass, PySyncObj's name of each step is bound to the subclass's hook itself
    (:data:`OVERRIDES`), so PySyncObj calls the hook with no frame in between."""

    raft: RaftState

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for theirs, ours in OVERRIDES.items():
            setattr(cls, theirs, getattr(cls, ours))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        gone = missing_names(self)
        if gone:
            raise RuntimeError(
                f"PySyncObj {installed_version()} lacks what DOQ uses of it (read from "
                f"{VERSION}, the version requirements.txt pins): {', '.join(gone)}")
        self.raft = RaftState(self)

    # The hooks. Each is, until a subclass overrides it, PySyncObj's own step (no frame in
    # between); an override calls ``super()`` for PySyncObj's.
    #: (time_to_wait) -> None: one tick, then the poll (PySyncObj's ``_onTick``)
    tick = SyncObj._onTick
    #: () -> None: queued commands into the log, or to the leader (``_checkCommandsToApply``)
    take_commands = SyncObj._checkCommandsToApply
    #: (command, callback, command_type=None) -> None: a command proposed here, or forwarded
    #: by a follower (``callback`` is then (node, request id)), into the queue (``_applyCommand``)
    queue_command = SyncObj._applyCommand
    #: (command) -> result: apply one committed log entry (``__doApplyCommand``)
    apply_command = getattr(SyncObj, PRIVATE + "doApplyCommand")

    # protected members DOQ uses
    #: () -> whether this node is the leader now (SyncObj's ``_isLeader`` itself: it is read
    #: while SyncObj.__init__ runs, before ``raft`` exists)
    leads = SyncObj._isLeader

    @property
    def poller(self) -> Any:
        return self._poller

    #: () -> the last leader this node heard of, or None (SyncObj's ``_getLeader`` itself)
    leader_node = SyncObj._getLeader

    def method_id(self, prefix: str) -> int:
        """The wire id of the replicated method whose name starts with ``prefix``."""
        return next(int(id_) for name, id_ in self._methodToID.items()
                    if str(name).startswith(prefix))

    def destroy_now(self) -> None:
        """Stop at once, in this thread (``_doDestroy``; ``destroy`` defers to the tick)."""
        self._doDestroy()


#: PySyncObj's name of each step DOQ replaces -> the hook that replaces it
OVERRIDES = {"_onTick": "tick", "_checkCommandsToApply": "take_commands",
             "_applyCommand": "queue_command", PRIVATE + "doApplyCommand": "apply_command"}
ENGINE_NAMES = ("_poller", "_isLeader", "_getLeader", "_methodToID", "_doDestroy")


# -- TCPTransport ------------------------------------------------------------------------------
class TransportBase(TCPTransport):  # type: ignore[misc]  # (no annotations)
    """``TCPTransport`` with its protected members under DOQ names.

    Steps DOQ replaces: :meth:`create_server`, :meth:`incoming_connection`,
    :meth:`introduction`, :meth:`message_received` (in a subclass, PySyncObj's names for the
    last three are bound to the subclass's hooks, :data:`TRANSPORT_HOOKS`). Steps it calls:
    :meth:`outgoing_connected`, :meth:`disconnected`, :meth:`node_connected`,
    :meth:`should_connect`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for theirs, ours in TRANSPORT_HOOKS.items():
            setattr(cls, theirs, getattr(cls, ours))

    # state, read through C-level getters (the transport reads some per message)
    if TYPE_CHECKING:
        raft_node: Any                          # the SyncObj this transport serves
        connections: dict[Any, Any]             # member node -> its connection
        unknown_connections: set[Any]           # accepted, not yet said which member
        nodes: set[Any]
        node_by_address: dict[str, Any]
    else:
        raft_node = property(operator.attrgetter("_syncObj"))
        connections = property(operator.attrgetter("_connections"))
        unknown_connections = property(operator.attrgetter("_unknownConnections"))
        nodes = property(operator.attrgetter("_nodes"))
        node_by_address = property(operator.attrgetter("_nodeAddrToNode"))

    # hooks (until overridden, PySyncObj's own steps; create_server returns the server)
    def create_server(self) -> Any:
        """The listening server; PySyncObj binds it later."""
        TCPTransport._createServer(self)
        return self._server

    #: (conn) -> None: a connection accepted
    incoming_connection = TCPTransport._onNewIncomingConnection
    #: (conn, message) -> None: an accepted connection's first message, the address of the
    #: member calling
    introduction = TCPTransport._onIncomingMessageReceived
    #: (node, message) -> None: a message from member ``node``, for the SyncObj
    message_received = TCPTransport._onMessageReceived

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

    # PySyncObj's name for the first (the others are bound by __init_subclass__)
    def _createServer(self) -> None:
        self._server = self.create_server()


#: TCPTransport's name of each step DOQ replaces -> the hook that replaces it
TRANSPORT_HOOKS = {"_onNewIncomingConnection": "incoming_connection",
                   "_onIncomingMessageReceived": "introduction",
                   "_onMessageReceived": "message_received"}
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

    gone = [f"SyncObj.{name}" for name in [*ATTRIBUTES.values(), *BOUND.values(),
                                            *STEPS.values(), *OVERRIDES, *ENGINE_NAMES]
            if not has(node, SyncObj, name)]
    transport = getattr(node, PRIVATE + "transport", None)
    gone += [f"TCPTransport.{name}" for name in TRANSPORT_NAMES
             if not isinstance(transport, TCPTransport) or not has(transport, TCPTransport, name)]
    gone += [f"{module.__name__}.{name}" for module, name in MODULE_NAMES
             if name not in vars(module)]
    return gone
