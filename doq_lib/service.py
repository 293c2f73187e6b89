"""The facade both transports call (L4): business operations over the log.

Writes (and reads by id) become operations (doq_lib/commands.py) handed to a proposer
(doq_lib/raft/proposer.py: group commit over Raft on a node, or in memory in tests); each
caller waits for its own result, which arrives after the entry is committed on a majority
(fsynced) and applied. A failed result becomes the error doq_lib/failures.py gives it.
"""
from __future__ import annotations

import collections
import logging
import time
import uuid
from typing import IO, Any, Callable, Iterator, NamedTuple, Sequence

import gevent
import gevent.event
import gevent.lock
from gevent import monkey

from doq_lib import backup_jobs
from doq_lib import commands as C
from doq_lib.clock import Clock, WallClock
from doq_lib.config import Config, split_host_port
from doq_lib.diskspace import DiskSpace
from doq_lib.errors import (
    DoqError,
    InsufficientStorage,
    InvalidArgument,
    NotLeader,
    QueueEmpty,
    QueueInUse,
    QueueNotFound,
    ResultCode,
    Unavailable,
)
from doq_lib.failures import REDRIVE_CODES, error_for_item, error_for_result, in_use_message
from doq_lib.fsm import MISSING, StateMachine
from doq_lib.fsm.consumers import ConsumerView
from doq_lib.fsm.inspect import STEP, STEP_SECONDS, Explained, Listed
from doq_lib.fsm.state import DeliveredMessage, StoredMessage
from doq_lib.ids import Snowflake
from doq_lib.models import GroupInfo, Message, QueueInfo, Strategy
from doq_lib.raft.proposer import Proposer
from doq_lib.rules import Token, delivery_token
from doq_lib.scheduler import Rounds, Scheduler

log = logging.getLogger(__name__)
_thread_ident = monkey.get_original("_thread", "get_ident")


#: The shortest wait for a queue whose next message is due (a proposal whose time, from
#: another node's clock, is not yet past it finds nothing: no spinning meanwhile).
MIN_REWAIT = 0.002
HEAVY_READS = 2          # browses and explains that run at once on a node
HEAVY_WAIT = 10.0        # seconds one more waits for its turn before a 503
READ_SHARE = 0.15        # of the node's time, at most, that those reads' steps take

#: One message of a batch: (queue, id or 0, group, priority, content, metadata or None)
EnqueueItem = C.Item


class NackOutcome(NamedTuple):
    """What a nack did: the message's priority now, its metadata as given, whether it was
    dead-lettered instead (its deliveries were used up), why not when its dead-letter queue
    refused it ("" otherwise), and the ids of the messages stored with the nack."""

    priority: int
    metadata: dict[str, str] | None
    dead_lettered: bool
    refused: str
    ids: list[int]


def _message(value: StoredMessage | DeliveredMessage) -> Message:
    """A message from the state machine's value (fsm.state's typed results)."""
    if isinstance(value, StoredMessage):                 # an enqueue's
        return Message(value.id, value.group, value.priority, value.content,
                       value.metadata or {}, duplicate=value.duplicate)
    since = value.delivered_at                           # dequeue, get
    return Message(value.id, value.group, value.priority, value.content, value.metadata or {},
                   value.deliveries, value.last_error, expires_at=value.expires_at,
                   delivery="" if since is None else
                   delivery_token(value.id, value.deliveries, since))


class Service:
    def __init__(self, cfg: Config, proposer: Proposer, fsm: StateMachine,
                 clock: Clock | None = None, backup_key: bytes | None = None) -> None:
        self.cfg = cfg
        self.proposer = proposer
        self.fsm = fsm
        self.backup_key = backup_key            # signs backups; restores must carry it
        self.clock = clock or WallClock()
        self.disk = DiskSpace(cfg.node_dir, cfg.storage.min_free_bytes)
        self.ids = Snowflake(self._node_number())
        host = split_host_port(cfg.raft.address)[0] or "localhost"
        self.http_addr = f"{host}:{cfg.http.port}"       # the server sets the bound port
        self.grpc_addr = ""                              # likewise, when gRPC is served
        self._greenlets: list[gevent.Greenlet] = []
        self.ready_listeners: list[Callable[[set[str]], None]] = []
        self._woken: collections.deque[set[str]] = collections.deque()
        self._watchers: dict[str, set[gevent.event.Event]] = {}   # queue -> waiting consumers
        self._loop_thread = _thread_ident()
        fsm.on_ready = self._on_ready_threadsafe
        self._heavy = gevent.lock.BoundedSemaphore(HEAVY_READS)   # browses and explains
        self.reads_stepped = 0                   # steps of those reads run (tests, metrics)
        self._next_read_step = 0.0               # monotonic: when the next step may run
        self.removed = ""          # why this node is no longer a member (cluster.Membership)
        self.scheduler = Scheduler(self, self._run)     # schedules: operations, firing
        self.rounds = Rounds(self, self._run)           # redelivery, holds, expiry, idle consumers

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self.proposer.start()
        self._greenlets = [gevent.spawn(self.rounds.run), gevent.spawn(self.scheduler.run)]

    def stop(self) -> None:
        gevent.killall(self._greenlets, timeout=2)
        self.proposer.stop()

    def on_leadership(self, leader: bool) -> None:
        """Called by the Raft node on every change; a new leader publishes its addresses."""
        if not leader:
            return
        cfg = self.cfg
        ops = [C.leader_config(cfg.cluster.node_id, cfg.raft.address, self.grpc_addr,
                               self.http_addr)]
        if not self.fsm.cluster_id:
            # the first leader of a new cluster names it (set once: a later proposal from
            # another leader changes nothing)
            ops.append(C.cluster_id(uuid.uuid4().hex))
        for op in ops:
            for _ in range(20):
                try:
                    self.submit(op)
                    break
                except Unavailable:
                    gevent.sleep(0.25)
                    if not self.proposer.is_leader:
                        return

    def _node_number(self) -> int:
        """1 + this node's position among the members (SPEC §5.7); ids never collide."""
        members = sorted(self.proposer.member_addresses())
        return 1 + members.index(self.cfg.raft.address) % 1023

    # -- wake-ups (state machine thread -> event loop) ---------------------------------------------
    def _on_ready_threadsafe(self, names: set[str]) -> None:
        if _thread_ident() == self._loop_thread and not self.ready_listeners and \
                not any(n in self._watchers for n in names):
            return     # nobody waits on these queues (checked in the loop's thread only: no race)
        self._woken.append(names)
        gevent.get_hub().loop.run_callback_threadsafe(self._fire_ready)

    def _fire_ready(self) -> None:
        while self._woken:
            names = self._woken.popleft()
            for name in names:
                for event in self._watchers.get(name, ()):
                    event.set()
            for listener in self.ready_listeners:
                listener(names)

    # -- plumbing ----------------------------------------------------------------------------------
    def submit(self, op: C.Op, size: int | None = None) -> tuple[int, Any]:
        """Propose ``op`` through the log and wait for its (code, value).

        Refused at once (503) when this node is cut off: no known leader, no quorum, a
        follower that has not heard from the leader lately, or a leader that a majority has
        not answered lately. What slips through a fresh cut times out and, should it reach
        the log later, is refused there (its entry carries a deadline).
        """
        cut_off = self.cut_off()
        if cut_off:
            raise Unavailable(cut_off)
        if C.grows(op):
            full = self.disk.problem()
            if full:
                raise InsufficientStorage(full)
        code, value = self.proposer.submit(op, size)
        if code == ResultCode.EXPIRED:
            raise error_for_result(C.name_of(op), code)
        return code, value

    def cut_off(self) -> str | None:
        """Why this node cannot take a write now (None: it can). ``submit`` and ``/readyz``
        ask the same question, so a node is ready exactly when it would accept a write."""
        return self.proposer.cut_off()

    def _run(self, op: C.Op, queue: str = "", size: int | None = None) -> Any:
        """Propose ``op`` and return its value; a failure raises the error
        doq_lib/failures.py gives its result code (``queue`` names the queue in it)."""
        code, value = self.submit(op, size)
        if code == ResultCode.OK:
            return value
        raise error_for_result(C.name_of(op), code, queue, value)

    # -- queues ------------------------------------------------------------------------------------
    def create_queue(self, name: str, qtype: str, strategy: Strategy, max_unacked: int,
                     ack_timeout: int, lifecycle: dict[str, Any] | None = None) -> bool:
        """``lifecycle``: the lifecycle settings by wire name (max_deliveries, ...). Whether
        a queue of that name existed already (then nothing changed)."""
        default = self.cfg.queue.default_acknowledgement_timeout
        return bool(self._run(C.create_queue(name, qtype, strategy, max_unacked, ack_timeout,
                                             default, lifecycle), name))

    def update_queue(self, name: str, strategy: Strategy, max_unacked: int,
                     ack_timeout: int, lifecycle: dict[str, Any] | None = None) -> None:
        """``lifecycle``: the lifecycle settings to change (the others keep their values)."""
        default = self.cfg.queue.default_acknowledgement_timeout
        self._run(C.update_queue(name, strategy, max_unacked, ack_timeout, default,
                                 lifecycle), name)

    def delete_queue(self, name: str, shown: Callable[[str], bool] | None = None) -> None:
        """``shown``: the queue names the caller may see (a refusal names only those)."""
        code, value = self.submit(C.delete_queue(name))
        if code == ResultCode.QUEUE_IN_USE:
            raise QueueInUse(in_use_message(name, value, shown))
        if code != ResultCode.OK:
            raise error_for_result("delete_queue", code, name, value)

    def list_queues(self) -> list[QueueInfo]:
        return self.fsm.queue_infos(int(self.clock.now()))

    def queue_info(self, name: str) -> QueueInfo:
        info = self.fsm.queue_info(name, int(self.clock.now()))
        if info is None:
            raise QueueNotFound("queue not found")
        return info

    # -- messages ----------------------------------------------------------------------------------
    def enqueue(self, queue: str, mid: int, group: str, priority: int, content: str,
                metadata: dict[str, str] | None, dedup_key: str = "", ttl: int = 0,
                delay: int = 0) -> Message:
        """The stored message; ``duplicate`` set (and the first message's id) when the queue
        saw the dedup key (or client id) within its dedup window: nothing stored then.
        ``ttl``: seconds it may wait to be delivered (0: the queue's message_ttl); ``delay``:
        seconds before a new message may be delivered."""
        value = self._run(C.enqueue(queue, mid, group, priority, content, metadata, dedup_key,
                                    ttl, delay), queue)
        return _message(value)

    def dequeue(self, queue: str, ack: bool, consumer: str = "") -> Message:
        if self.deliverable(queue) is False:                  # fast path: nothing to deliver
            raise self._nothing(queue)
        value = self._run(C.dequeue(queue, ack, consumer), queue)
        return _message(value)

    def _nothing(self, queue: str) -> DoqError:
        """What a dequeue that finds nothing deliverable on this replica answers."""
        code = ResultCode.QUEUE_PAUSED if self.fsm.paused(queue) else ResultCode.QUEUE_EMPTY
        return error_for_result("dequeue", code, queue)

    def enqueue_batch(self, items: list[EnqueueItem]) -> list[int]:
        """Enqueue every item (any queues) as one operation: all are stored, or none.

        Returns the ids in item order.
        """
        size = sum(len(item.content) for item in items) + 48 * len(items)
        values = self._run(C.enqueue_batch(items), size=size)
        return [v.id for v in values]

    def enqueue_seq(self, items: list[EnqueueItem]) -> tuple[list[Message], DoqError | None]:
        """Enqueue items in order, stopping at the first that fails; nothing after it applies."""
        values, failure = self._run(C.enqueue_seq(items))
        error = None
        if failure is not None:                   # (code, queue) of the item it stopped at
            error = error_for_result("enqueue_seq", failure[0], failure[1])
        return [_message(v) for v in values], error

    def deliverable(self, queue: str) -> bool | None:
        """Whether this replica has something deliverable now (None: queue unknown here)."""
        due = self.fsm.deliverable_ms(queue)
        if due is MISSING:
            return None
        return due is not None and due <= self.clock.now() * 1000

    def dequeue_many(self, queue: str, ack: bool, count: int,
                     consumer: str = "") -> list[Message]:
        """Up to ``count`` messages (at least one) in one operation, else QueueEmpty."""
        if self.deliverable(queue) is False:
            raise self._nothing(queue)
        values = self._run(C.dequeue_many(queue, ack, count, consumer), queue)
        return [_message(v) for v in values]

    def ack_many(self, queue: str, ids: list[int],
                 tokens: Sequence[Token | None] | None = None) -> list[int]:
        """Acknowledge ``ids``; returns those that were not delivered and unacknowledged
        (or whose token, in ``tokens``, was not their current delivery's)."""
        return self._run(C.ack_many(queue, ids, tokens), queue)  # type: ignore[no-any-return]

    def ack_ids(self, queue: str, ids: list[int],
                tokens: Sequence[Token | None] | None = None) -> list[tuple[int, DoqError]]:
        """Acknowledge ``ids`` in one operation (``tokens``: None, or each one's delivery
        token or None); the (id, error) of each that failed (its state is unchanged)."""
        return self._failures(queue, self._run(C.ack_ids(queue, ids, tokens), queue))

    def ack_ids_enqueue(self, queue: str, ids: list[int],
                        tokens: Sequence[Token | None] | None,
                        enqueue: Sequence[Sequence[EnqueueItem]],
                        ) -> tuple[list[tuple[int, DoqError]], list[list[int]]]:
        """Acknowledge ``ids`` in one operation, each storing its ``enqueue`` items (one
        list per id) with its ack, all or nothing per id: the (id, error) of each that failed
        (nothing of it happened) and, per id, the ids it stored."""
        failed, stored = self._run(C.ack_ids(queue, ids, tokens, enqueue), queue)
        return [(mid, error_for_item(queue, mid, code, detail))
                for mid, code, detail in failed], stored

    def nack_ids(self, queue: str, ids: list[int], priority: int,
                 metadata: dict[str, str] | None, error: str = "",
                 delay: int = 0, tokens: Sequence[Token | None] | None = None,
                 ) -> list[tuple[int, DoqError]]:
        """Give ``ids`` back in one operation (priority 0 / metadata None: keep each
        message's own; ``delay``: seconds held back; ``tokens`` as for ack_ids); the (id,
        error) of each that failed."""
        return self._failures(queue, self._run(
            C.nack_ids(queue, ids, priority, metadata, error, delay, tokens), queue))

    @staticmethod
    def _failures(queue: str, failed: list[tuple[int, int]]) -> list[tuple[int, DoqError]]:
        return [(mid, error_for_item(queue, mid, code)) for mid, code in failed]

    def take(self, queue: str, ack: bool, count: int, wait: float,
             cancel: gevent.event.Event | None = None, consumer: str = "") -> list[Message]:
        """Up to ``count`` messages in one operation, waiting up to ``wait`` seconds for the
        first when nothing is deliverable; [] when none came. Once ``cancel`` is set (the
        caller went away) nothing more is taken."""
        deadline = time.monotonic() + wait
        event = gevent.event.Event()

        def wake(_: Any) -> None:
            event.set()
        if cancel is not None:
            cancel.rawlink(wake)
        try:
            while cancel is None or not cancel.is_set():
                try:
                    return self.dequeue_many(queue, ack, count, consumer)
                except QueueEmpty:
                    pass
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                event.clear()
                self.wait_ready(queue, left, event)
            return []
        finally:
            if cancel is not None:
                cancel.unlink(wake)

    def wait_ready(self, queue: str, timeout: float,
                   event: gevent.event.Event | None = None) -> None:
        """Block until ``queue`` may have something to deliver on this replica, or ``timeout``
        (or until ``event``, when given, is set by someone else).

        Woken by enqueues, nacks, redeliveries and acks that free a fair group; a delayed
        queue whose head falls due sooner than ``timeout`` shortens the wait.
        """
        due = self.fsm.deliverable_ms(queue)
        if isinstance(due, int):       # a scheduled head, a group's rate: due then
            timeout = min(timeout, max(MIN_REWAIT, due / 1000 - self.clock.now()))
        event = event or gevent.event.Event()
        watchers = self._watchers.setdefault(queue, set())
        watchers.add(event)
        try:
            event.wait(timeout)
        finally:
            watchers.discard(event)
            if not watchers:
                self._watchers.pop(queue, None)

    def get(self, queue: str, mid: int) -> Message:
        return _message(self._run(C.get(queue, mid), queue))

    def delete(self, queue: str, mid: int) -> None:
        self._run(C.delete(queue, mid), queue)

    def ack(self, queue: str, mid: int, token: Token | None = None,
            enqueue: Sequence[EnqueueItem] = ()) -> list[int]:
        """Acknowledge a delivered message (``token``: of the delivery it must still be in;
        StaleDelivery when it is not) and store ``enqueue`` with it, all or nothing: the
        ids stored, in order."""
        return self._settled(self._run_settle(C.ack(queue, mid, token, enqueue), queue),
                             enqueue)[1]

    def nack(self, queue: str, mid: int, priority: int, metadata: dict[str, str] | None,
             error: str = "", delay: int = 0, token: Token | None = None,
             enqueue: Sequence[EnqueueItem] = ()) -> NackOutcome:
        """Give a delivered message back (``delay``: seconds before it is deliverable; 0
        and no priority: the queue's back-off), storing ``enqueue`` with it, all or
        nothing."""
        value, ids = self._settled(self._run_settle(C.nack(
            queue, mid, priority, metadata, error, delay, token, enqueue), queue), enqueue)
        return NackOutcome(value.priority, value.metadata, value.dead_lettered, value.refused,
                           ids)

    def reject(self, queue: str, mid: int, error: str = "", token: Token | None = None,
               enqueue: Sequence[EnqueueItem] = (), reason: str = "rejected") -> list[int]:
        """Dead-letter a delivered message now (``reason``: models.REJECT_REASONS), storing
        ``enqueue`` with it, all or nothing: the ids stored."""
        return self._settled(self._run_settle(C.reject(queue, mid, error, token, enqueue,
                                                       reason), queue), enqueue)[1]

    def _run_settle(self, op: C.Op, queue: str) -> Any:
        """``_run`` for a settle that may carry items: an unknown target queue of an item
        (the result's detail) is the queue its error names."""
        code, value = self.submit(op)
        if code == ResultCode.OK:
            return value
        if code == ResultCode.QUEUE_NOT_FOUND and isinstance(value, str):
            queue = value
        raise error_for_result(C.name_of(op), code, queue, value)

    @staticmethod
    def _settled(value: Any, enqueue: Sequence[EnqueueItem]) -> tuple[Any, list[int]]:
        """(a settle's own result, the ids its items got) from its operation's result."""
        return (value[0], list(value[1])) if enqueue else (value, [])

    def redrive(self, queue: str, to: str, ids: list[int] | None,
                limit: int) -> tuple[int, list[tuple[int, str, str]]]:
        """Move waiting messages of a dead-letter queue back (``to`` "": each to its
        x-dead-from; ``ids`` None: the first ``limit`` in id order): (how many moved, the
        (id, code, detail) of each that was not)."""
        code, value = self.submit(C.redrive(queue, to, ids, limit))
        if code == ResultCode.QUEUE_NOT_FOUND and value:
            raise InvalidArgument(f"to: queue {value!r} does not exist")
        if code != ResultCode.OK:
            raise error_for_result("redrive", code, queue, value)
        moved, failed = value
        return moved, [(mid, REDRIVE_CODES.get(c, "internal"), detail)
                       for mid, c, detail in failed]

    # -- operator controls ---------------------------------------------------------
    def purge(self, queue: str, include_unacked: bool = False) -> int:
        """Drop every waiting message (and, asked, every delivered one): how many."""
        return self._run(C.purge(queue, include_unacked), queue)  # type: ignore[no-any-return]

    def set_paused(self, queue: str, paused: bool, group: str = "") -> bool:
        """Pause or resume the queue (``group`` ""), or a group of a fair queue and its
        sub-groups; whether that changed anything."""
        return self._run(C.set_paused(queue, group, paused), queue)  # type: ignore[no-any-return]

    def consumers(self, queue: str) -> list[ConsumerView]:
        """The consumers the queue knows (by name), from this replica."""
        found = self.fsm.serialize(lambda: self.fsm.queue_consumers(queue))
        if found is None:
            raise error_for_result("get", ResultCode.QUEUE_NOT_FOUND, queue)
        return found  # type: ignore[no-any-return]

    def groups(self, queue: str) -> list[GroupInfo]:
        """The queue's groups with their counts and pauses, from this replica."""
        found = self.fsm.serialize(lambda: self.fsm.queue_groups(queue))
        if found is None:
            raise error_for_result("purge", ResultCode.QUEUE_NOT_FOUND, queue)
        return found  # type: ignore[no-any-return]

    def browse(self, queue: str, state: str, group: str | None, after: int | None,
               limit: int, max_bytes: int = 0,
               cancelled: Callable[[], bool] | None = None,
               ) -> tuple[list[Listed], int | None]:
        """A page of the queue's messages from this replica, changing nothing: (the page,
        the id to continue after, or None at the end); ``max_bytes``: the page's size at
        most, about (0: any; one message at least). Taken in steps (see _run_steps);
        ``cancelled``: whether the caller left (then it stops)."""
        now_ms = int(self.clock.now() * 1000)
        job = self.fsm.serialize(lambda: self.fsm.browse_job(
            queue, state, group, after, limit, max_bytes, now_ms))
        if job is None:
            raise error_for_result("get", ResultCode.QUEUE_NOT_FOUND, queue)
        self._run_steps(job, queue, cancelled)
        return self.fsm.serialize(job.result)  # type: ignore[no-any-return]

    def explain(self, queue: str, mid: int,
                cancelled: Callable[[], bool] | None = None) -> Explained:
        """Why message ``mid`` is (not) being delivered, from this replica at its time."""
        now_ms = int(self.clock.now() * 1000)
        try:
            job = self.fsm.serialize(lambda: self.fsm.explain_job(queue, mid, now_ms))
        except LookupError:
            raise error_for_result("get", ResultCode.MESSAGE_NOT_FOUND, queue) from None
        if job is None:
            raise error_for_result("get", ResultCode.QUEUE_NOT_FOUND, queue)
        self._run_steps(job, queue, cancelled)
        return job.result()  # type: ignore[no-any-return]

    def _run_steps(self, job: Any, queue: str, cancelled: Callable[[], bool] | None) -> None:
        """Run ``job`` step by step where no apply runs meanwhile; stop for a caller that
        left. Each step waits until the event loop has nothing else to do (probes, Raft,
        writes and dequeues go first). A read done in one step (a first page, as a rule)
        is served like any request; a longer one then waits its turn among HEAVY_READS
        (a 503 after HEAVY_WAIT), and the steps of those share READ_SHARE of the node's
        time at most: after a step the next one waits until the rest has passed."""
        if self._step(job, queue, cancelled):
            return
        if not self._heavy.acquire(timeout=HEAVY_WAIT):
            raise Unavailable(f"busy: {HEAVY_READS} long browse and explain requests are "
                              "running on this node; retry in a moment")
        try:
            while True:
                wait = self._next_read_step - time.monotonic()
                if wait > 0:
                    gevent.sleep(wait)
                started = time.monotonic()
                done = self._step(job, queue, cancelled)
                ended = time.monotonic()
                self._next_read_step = ended + (ended - started) * (1 / READ_SHARE - 1)
                if done:
                    return
        finally:
            self._heavy.release()

    def _step(self, job: Any, queue: str, cancelled: Callable[[], bool] | None) -> bool:
        """One step of ``job`` once the loop is idle; whether the job is done."""
        gevent.idle()
        if cancelled is not None and cancelled():
            raise Unavailable("the client went away: the read was stopped")
        try:
            done: bool = self.fsm.serialize(lambda: job.step(STEP, STEP_SECONDS))
        except LookupError:
            raise error_for_result("get", ResultCode.QUEUE_NOT_FOUND, queue) from None
        self.reads_stepped += 1
        return done

    def touch(self, queue: str, mid: int, token: Token | None = None) -> None:
        """Extend a delivered message's lease (StaleDelivery when ``token`` is not its
        current delivery's: the caller lost it)."""
        self._run(C.touch(queue, mid, token), queue)

    def update_priority(self, queue: str, mid: int, priority: int) -> None:
        self._run(C.update_priority(queue, mid, priority), queue)

    def generate_ids(self, count: int) -> list[int]:
        return self.ids.generate(count)

    # -- backups and restores (doq_lib/backup_jobs.py) -----------------------------------------
    def backup(self, since: int) -> tuple[int, Iterator[bytes]]:
        """(last version, the backup file in chunks) from this node's store; leader only."""
        if not self.proposer.is_leader:
            raise NotLeader("Only leader can create a backup")
        source = f"{self.cfg.cluster.node_id}@{self.cfg.raft.address}"
        return backup_jobs.stream_backup(self.fsm.store, since, source, self.backup_key)

    def restore(self, files: list[IO[bytes]]) -> dict[str, Any]:
        """Restore backups through the log (every replica ends identical); leader only."""
        if not self.proposer.is_leader:
            raise NotLeader("Only leader can restore a backup")
        return backup_jobs.restore(files, self.fsm, self._run, self.submit, self.backup_key)

    # -- cluster -----------------------------------------------------------------------------------
    def readiness(self) -> tuple[bool, str]:
        if self.removed:
            return False, self.removed
        ready, why = self.proposer.readiness()
        full = self.disk.problem() if ready else None
        return (False, full) if full else (ready, why)

    def status(self) -> dict[str, Any]:
        return {"node_id": self.cfg.cluster.node_id, "http_addr": self.http_addr,
                "grpc_addr": self.grpc_addr, "cluster_id": self.fsm.cluster_id,
                "raft": self.proposer.status(), "committer": self.proposer.stats()}

    def state_digest(self) -> dict[str, Any]:
        """Applied index and a digest of every stored record (replica consistency checks)."""
        applied, digest, queues = gevent.get_hub().threadpool.apply(self.fsm.store.digests)
        return {"node_id": self.cfg.cluster.node_id, "applied_index": applied, "digest": digest,
                "queue_digest": queues}

