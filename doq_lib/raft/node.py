"""The Raft node (L3): PySyncObj with durability, group-commit friendly settings and LMDB apply.

PySyncObj is reached only through :mod:`doq_lib.raft.engine`, the seam that names every
internal of it DOQ uses (``self.raft``: its private Raft state). One replicated method exists:
``apply_batch(ops, now_ms)``; the service layer proposes one call per group-commit batch and
gets each batch's results through ``callback(result, error)``, where ``result`` is an
:class:`~doq_lib.raft.pipeline.EntryResult`.

The node is ticked by its own greenlet (``autoTick=False``) with DOQ's tick
(:mod:`doq_lib.raft.tick`: commit index, apply, new commands, one send per follower,
compaction); before it polls, an on-tick callback starts syncing what the tick appended, so
the leader's fsync overlaps the followers' work. Between ticks the node sleeps until something
happens: a message, a proposal (:class:`~doq_lib.raft.poller.LoopNotifier`), a finished sync, or
the next heartbeat / election deadline. Journal syncs are native AIO requests
(:class:`~doq_lib.raft.aio.AioSync`; a dedicated thread, :class:`~doq_lib.raft.syncer.SyncThread`,
where AIO is refused); when one completes, a follower's held acks leave at once from the event
loop, and the leader's tick wakes to count its own vote.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import gevent

from doq_lib import commands as C
from doq_lib.clock import Clock, WallClock
from doq_lib.config import Config
from doq_lib.fsm import StateMachine
from doq_lib.fsm.state import RULES
from doq_lib.lmdb_store import LmdbStore
from doq_lib.raft import aio, net, poller, tick, wire
from doq_lib.raft.aio import AioSync
from doq_lib.raft.durability import (
    MEMBERSHIP,
    DurableJournal,
    DurableTransport,
    register_journal,
    run_inline,
)
from doq_lib.raft.engine import FAIL_REASON, LEADER, Engine, SyncObjConf, monotonic, replicated
from doq_lib.raft.pipeline import ApplyPipeline
from doq_lib.raft.snapshot import SnapshotManager, snapshot_path
from doq_lib.raft.syncer import SyncThread
from doq_lib.secret import ClusterSecret

log = logging.getLogger(__name__)

ENTRY_SIZE_LIMIT = 16 << 20        # appendEntriesBatchSizeBytes; batches are capped far below
# apply_batch's arguments past ops and now_ms, as an entry without them means them
_CALL_DEFAULTS: tuple[Any, ...] = (None, 0, 0, "", 1)


def _forwarded_batch(command: bytes) -> tuple[float, list[Any]] | None:
    """(deadline in ms or 0, operations) of a forwarded ``apply_batch`` command; None for
    anything else."""
    if command[:1] != b"\x00":                   # not a regular replicated call
        return None
    try:
        args = wire.loads_command(command[1:])[1]
        ops = args[0] if isinstance(args[0], list) else []
        return (args[2] if len(args) > 2 else 0), ops
    except Exception:  # noqa: BLE001 - not ours to judge: let PySyncObj handle it
        return None


def _grows(ops: list[Any]) -> bool:
    """Whether a forwarded batch holds an operation that grows the stored data."""
    return any(isinstance(op, tuple) and op and op[0] in C.GROWS for op in ops)


def _bind_address(address: str) -> str:
    """``:9000`` (no host) binds every interface."""
    host, _, port = address.rpartition(":")
    return f"{host or '0.0.0.0'}:{port}"


def _hub_blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking syscall in a real OS thread; the calling greenlet waits cooperatively."""
    return gevent.get_hub().threadpool.apply(fn, args)


class RaftNode(Engine):
    def __init__(self, cfg: Config, store: LmdbStore, fsm: StateMachine,
                 on_leadership: Callable[[bool], None] | None = None,
                 peers: list[str] | None = None,
                 secret: ClusterSecret | None = None) -> None:
        wire.install()
        self.clock: Clock = WallClock()     # the node's (server.py sets its SteadyClock)
        # why writes that grow the data are refused now (server.py: the disk's reserve)
        self.storage_problem: Callable[[], str | None] = lambda: None
        self.doq_wire_security = wire.WireSecurity(secret.key("raft") if secret else None,
                                                   lambda: fsm.cluster_id)
        poller.install()
        net.bind_outgoing(net.source_host(cfg.raft.bind_address or cfg.raft.address))
        raft_dir = os.path.join(cfg.node_dir, "raft")
        os.makedirs(raft_dir, mode=0o700, exist_ok=True)
        self.fsm = fsm
        self.pipeline = ApplyPipeline(fsm, threaded=cfg.raft.apply_in_thread)
        self.snapshots = SnapshotManager(snapshot_path(cfg.node_dir), store, fsm, self.pipeline)
        threaded = cfg.raft.fsync_in_thread
        self._max_log_bytes = cfg.raft.snapshot_max_log_bytes
        self._syncer: AioSync | SyncThread | None = None
        if threaded:
            self._syncer = AioSync() if aio.available(raft_dir) else SyncThread()
        self.doq_journal = DurableJournal(os.path.join(raft_dir, "journal.bin"),
                                          _hub_blocking if threaded else run_inline,
                                          self._syncer.submit if self._syncer else None)
        register_journal(self.doq_journal)
        if cfg.faults.enabled:
            # fault injection: while the file exists, every journal sync counts as failed /
            # every journal write raises EIO
            fail_sync, fail_write = cfg.faults.fail_fsync_file, cfg.faults.fail_write_file
            if fail_sync:
                self.doq_journal.sync_fails = lambda: os.path.exists(fail_sync)
            if fail_write:
                self.doq_journal.write_fails = lambda: os.path.exists(fail_write)
        self._on_leadership = on_leadership
        self._tick_period = cfg.raft.tick_period
        self._loop: gevent.Greenlet | None = None
        self._stopping = False
        self._caught_up_term = -1       # the term in which this leader was last caught up
        self.late_commands_dropped = 0
        self.address = cfg.raft.address
        if peers is None:
            peers = [p for p in cfg.cluster.peers if p != self.address]
        super().__init__(self.address, peers, self._conf(cfg, raft_dir),
                         transportClass=DurableTransport)
        self.transport: DurableTransport = self.raft.transport
        # Wakes the tick when a command is queued (PySyncObj's pipe notifier is not used).
        self._notifier = poller.LoopNotifier(self.poller)
        self.doq_sent_commit = 0            # the commit index the followers were last sent
        self.doq_max_entry_bytes = cfg.raft.max_batch_bytes     # merged entries (tick.py)
        self.doq_pipeline_entries = cfg.raft.pipeline_entries   # uncommitted at once (tick.py)
        self._apply_batch_id = self.method_id("apply_batch")
        self.doq_journal.on_synced = self._synced
        self.transport.ack_repeat_after = cfg.raft.append_entries_period / 2
        self.addOnTickCallback(self._before_poll)

    def _conf(self, cfg: Config, raft_dir: str) -> SyncObjConf:
        raft = cfg.raft
        return SyncObjConf(
            autoTick=False,
            bindAddress=_bind_address(raft.bind_address or raft.address),
            journalFile=self.doq_journal.path,
            fullDumpFile=self.snapshots.path,
            serializer=self.snapshots.serialize,
            deserializer=self.snapshots.deserialize,
            serializeChecker=self.snapshots.check,
            useFork=False,
            # Nothing of PySyncObj's own sends per command; the tick (tick.py) decides.
            appendEntriesUseBatch=True,
            appendEntriesPeriod=raft.append_entries_period,
            appendEntriesBatchSizeBytes=ENTRY_SIZE_LIMIT,
            raftMinTimeout=raft.election_timeout_min,
            raftMaxTimeout=raft.election_timeout_max,
            leaderFallbackTimeout=raft.leader_fallback_timeout,
            connectionTimeout=max(3.5, raft.election_timeout_max),
            connectionRetryTime=raft.connection_retry_time,
            commandsWaitLeader=False,
            commandsQueueSize=200_000,
            logCompactionMinEntries=raft.snapshot_min_entries,
            logCompactionMinTime=raft.snapshot_min_interval,
            logCompactionBatchSize=1 << 20,
            sendBufferSize=1 << 21,
            recvBufferSize=1 << 21,
            maxBindRetries=1,
            dynamicMembershipChange=True,
            onStateChanged=self._state_changed,
        )

    # -- the one replicated method -----------------------------------------------------------------
    @replicated
    def apply_batch(self, ops: list[Any], now_ms: int, expires_ms: int = 0,
                    batch_id: str = "", rules: int = 1) -> Any:
        # raftLastApplied is incremented after this returns: +1 is this entry's index.
        return self.pipeline.submit(self.raftLastApplied + 1, ops, now_ms, expires_ms, batch_id,
                                    rules)

    def apply_command(self, command: bytes) -> Any:
        """Apply one committed command; one that cannot be decoded as plain data is skipped.

        Every replica decodes the same bytes with the same restricted loader, so all of them
        skip it alike; raising instead would retry the entry forever (docs/ARCHITECTURE.md,
        The Raft wire).
        """
        try:
            if command[:1] == tick.MERGED:
                return self._apply_merged(command)
            if command[:1] == MEMBERSHIP and self._superseded(command):
                return None
            return super().apply_command(command)
        except wire.UnsafePayload as exc:
            log.error("raft: skipped a committed command that is not plain data: %s", exc)
            return None

    def _apply_merged(self, command: bytes) -> Any:
        """A merged entry (tick.append_commands): every ``apply_batch`` call in it, in order,
        as one state machine entry whose results each proposer finds by its batch id."""
        groups = []
        for sub in wire.loads_command(command[1:]):
            call = wire.loads_command(sub[1:]) if sub[:1] == tick.REGULAR else None
            if not isinstance(call, tuple) or len(call) < 2 or call[0] != self._apply_batch_id:
                log.error("raft: skipped a part of a merged entry that is not apply_batch")
                continue
            args = tuple(call[1])
            ops, now_ms, expires_ms, batch_id, rules = args + _CALL_DEFAULTS[len(args):]
            groups.append((ops, now_ms, expires_ms, batch_id, rules))
        # raftLastApplied is incremented after this returns: +1 is this entry's index.
        return self.pipeline.submit_groups(self.raftLastApplied + 1, groups)

    def take_commands(self) -> None:
        """The leader merges queued replicated calls into one entry (tick.append_commands);
        a follower forwards each command to the leader (PySyncObj's code)."""
        if self.raft.state == LEADER:
            tick.append_commands(self)
        else:
            super().take_commands()

    def _superseded(self, command: bytes) -> bool:
        """Whether a later log entry changes the membership of the same node.

        PySyncObj applies a configuration change when it is appended and again when it is
        applied at commit (for replays after a restart). An addition undone before it committed
        (cluster.Membership) would be re-applied on top of its undoing removal and bring the
        member back, so a change followed by another one for the same node is not re-applied:
        the later one, already in effect, decides.
        """
        node_id = wire.loads_command(command[1:])[1]
        later = self.raft.entries(self.raftLastApplied + 2)
        return any(entry[0][:1] == MEMBERSHIP and wire.loads_command(entry[0][1:])[1] == node_id
                   for entry in later)

    def propose(self, ops: list[Any], now_ms: int, callback: Callable[[Any, int], None],
                expires_ms: int = 0, batch_id: str = "") -> None:
        self.apply_batch(ops, now_ms, expires_ms, batch_id, RULES, callback=callback)

    def tick(self, time_to_wait: float) -> None:
        tick.tick(self, time_to_wait)

    def doq_commit_index(self, synced_index: int) -> int:
        """The commit index the leader may announce (see :func:`tick.commit_index`)."""
        return tick.commit_index(self.raft, synced_index)

    def queue_command(self, command: bytes, callback: Any, command_type: Any = None) -> None:
        """On the leader, drop a follower's command that arrives after its deadline.

        A follower cut off from the leader may still have a command in a TCP buffer; when the
        partition heals it is delivered. Its caller was answered "timed out" long ago, so it
        must not be appended now (the state machine would also refuse it, but only once the
        log's clock has passed the deadline).
        """
        batch = _forwarded_batch(command) \
            if isinstance(callback, tuple) and command_type is None else None
        if batch is not None:
            expires, ops = batch
            if expires and expires < self.clock.now() * 1000:
                self._deny(callback, "it arrived after its deadline")
                self.late_commands_dropped += 1
                return
            problem = self.storage_problem()
            if problem is not None and _grows(ops):
                self._deny(callback, problem)        # the leader's disk is below its reserve
                return
        super().queue_command(command, callback, command_type)
        self._notifier.notify()

    def _deny(self, callback: tuple[Any, Any], why: str) -> None:
        node, request_id = callback
        self.transport.send(node, {"type": "apply_command_response", "request_id": request_id,
                                   "error": FAIL_REASON.REQUEST_DENIED})
        log.warning("refused a write forwarded by %s: %s", getattr(node, "address", node), why)

    # -- freshness ------------------------------------------------------------------------------
    def leader_contact_age(self) -> float:
        """Seconds since a follower last heard from a leader (0 on the leader)."""
        if self.is_leader:
            return 0.0
        return time.monotonic() - self.transport.last_leader_contact

    def majority_recent(self, window: float) -> bool:
        """On the leader: a majority (itself included) answered within ``window`` seconds."""
        last = self.raft.last_response_time
        cutoff = time.monotonic() - window
        fresh = 1 + sum(1 for node in self.otherNodes if last.get(node, 0.0) > cutoff)
        return fresh > (len(self.otherNodes) + 1) / 2

    # -- ticking -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = gevent.spawn(self._run)

    def _run(self) -> None:
        while not self._stopping:
            try:
                self._before_poll()
                self.doTick(self._poll_timeout())
            except Exception:  # noqa: BLE001 - keep ticking; PySyncObj's own loop does the same
                log.exception("raft tick failed")
                gevent.sleep(self._tick_period)

    def _synced(self) -> None:
        """A journal sync completed: a follower's held acks leave now (no tick needed);
        the leader's tick is woken to count its own vote toward the commit index (the
        leader counts itself only up to its synced index, see tick.commit_index)."""
        self.transport.release_acks()
        if self.is_leader:
            self._notifier.notify()

    def _poll_timeout(self) -> float:
        """How long the tick may sleep when nothing arrives: until the leader's next
        heartbeat or a follower's election deadline, at most ``tick_period``."""
        if self.is_leader:
            due = self.raft.next_heartbeat
        else:
            due = self.raft.election_deadline
        return max(0.0, min(self._tick_period, due - monotonic()))

    def _before_poll(self) -> None:
        """Start syncing what this tick appended (overlaps the poll); send covered acks;
        ask for a snapshot when the log holds too many bytes (it is kept in memory).

        When the sync completes, ``on_synced`` wakes the poll, so the next tick releases the
        follower's acks or lets the leader count its own vote without a poll timeout.
        """
        self.doq_journal.start_sync()
        self.transport.release_acks()
        if self.doq_journal.size_bytes > self._max_log_bytes:
            self.forceLogCompaction()

    def _state_changed(self, old: int, new: int) -> None:
        if self._on_leadership is not None and (old == LEADER) != (new == LEADER):
            gevent.spawn(self._on_leadership, new == LEADER)

    def stop(self) -> None:
        self._stopping = True
        if self._loop is not None:
            self._loop.join(timeout=5)
        self.pipeline.close()
        self.destroy_now()
        if self._syncer is not None:
            self._syncer.stop()

    # -- status ------------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return bool(self.leads())

    @property
    def leader_address(self) -> str | None:
        leader = self.leader_node()
        return leader.address if leader is not None else None

    @property
    def has_quorum(self) -> bool:
        return bool(self.hasQuorum)

    def caught_up(self) -> bool:
        """Whether this node's state machine holds every write the cluster acknowledged.

        PySyncObj's ``isReady`` turns true once the applied index reaches the commit index
        the node knows. A leader that just started (or was just elected) may know only an
        old commit index: the one in its journal's meta, which is stored lazily, so after a
        kill it can lag the acknowledged writes by up to a second. Raft's answer: a leader
        knows the commit index only once an entry of its own term has committed. So a leader
        is caught up once that entry has committed and everything up to it has been applied;
        then it stays so for the rest of its term (later commits are new writes, and under
        load the apply pipeline is never idle). A follower is caught up when ``isReady``
        says so."""
        if not self.isReady():
            return False
        if not self.is_leader:
            return True
        term = self.raft.current_term
        if self._caught_up_term == term:
            return True
        commit = self.raft.commit_index
        entries = self.raft.entries(commit, 1)
        if not entries or entries[0][2] != term or self.raftLastApplied < commit:
            return False
        if not (self.pipeline.idle or self.pipeline.resolved_index >= commit):
            return False
        self._caught_up_term = term
        return True

    # -- membership ------------------------------------------------------------------------------
    def member_addresses(self) -> set[str]:
        return {self.address} | {n.address for n in self.otherNodes}

    def add_member(self, address: str, callback: Callable[[Any, int], None]) -> None:
        self.addNodeToCluster(address, callback=callback)

    def remove_member(self, address: str, callback: Callable[[Any, int], None]) -> None:
        self.removeNodeFromCluster(address, callback=callback)

    def transfer_leadership(self) -> None:
        """Ask the most up-to-date follower to start an election now (Raft TimeoutNow)."""
        self.transferLeadership(None, callback=lambda result, error: None)

    def last_response(self, address: str) -> float | None:
        """Monotonic time the leader last heard from member ``address`` (None: not a member).

        PySyncObj sets it to the time of the change when a member is added, then to the time
        of each answer."""
        last = self.raft.last_response_time
        for node, when in last.items():
            if node.address == address:
                return when
        return None

    def follower_lags(self) -> dict[str, int]:
        """Entries each follower is behind the commit index (leader only)."""
        commit = self.raftCommitIndex
        return {addr: max(commit - match, 0) for addr, match in self.match_indexes().items()}

    def connected_peers(self) -> dict[str, bool]:
        """Whether this node has a live connection to each other member."""
        status = self.getStatus()
        prefix = "partner_node_status_server_"
        return {k[len(prefix):]: v == 2 for k, v in status.items() if k.startswith(prefix)}

    def match_indexes(self) -> dict[str, int]:
        status = self.getStatus()
        prefix = "match_idx_server_"
        return {k[len(prefix):]: v for k, v in status.items() if k.startswith(prefix)}

    def status(self) -> dict[str, Any]:
        status = self.getStatus()
        return {
            "state": {0: "follower", 1: "candidate", 2: "leader"}.get(status["state"], "?"),
            "leader": self.leader_address,
            "has_quorum": status["has_quorum"],
            "term": status["raft_term"],
            "commit_index": status["commit_idx"],
            "last_applied": status["last_applied"],
            "fsm_applied": self.fsm.applied_index,
            "log_len": status["log_len"],
            "match_index": self.match_indexes(),
            "journal_syncs": self.doq_journal.stats.syncs,
            "acks_unsynced": self.doq_journal.stats.acks_unsynced,
        }
