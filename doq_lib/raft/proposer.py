"""The seam between the service and replication (L3): a :class:`Proposer`.

The service hands each operation (doq_lib/commands.py) to a proposer and waits for its
``(result code, value)``; it asks the proposer whether this node can take a write now and
whether it leads. Two proposers:

* :class:`RaftProposer`: group commit over the Raft node. Its :class:`Committer` gathers
  pending operations into batches, one Raft entry per batch, with a bounded number in flight;
  each caller gets its result once the entry is committed on a majority (fsynced) and applied.
* :class:`LocalProposer`: in memory, for tests. Each operation is applied at once through the
  real state machine, on one node that always leads.
"""
from __future__ import annotations

import collections
import enum
import functools
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

import gevent
import gevent.event
from gevent.event import AsyncResult

from doq_lib import commands as C
from doq_lib.clock import Clock
from doq_lib.errors import DoqError, InternalError, Unavailable
from doq_lib.fsm.state import RULES

if TYPE_CHECKING:
    from doq_lib.fsm import StateMachine
    from doq_lib.raft.node import RaftNode

log = logging.getLogger(__name__)


class RaftError(enum.IntEnum):
    """Why PySyncObj did not commit a command (its FAIL_REASON codes, by name: nothing outside
    doq_lib/raft imports pysyncobj)."""

    SUCCESS = 0
    QUEUE_FULL = 1
    MISSING_LEADER = 2
    DISCARDED = 3
    NOT_LEADER = 4
    LEADER_CHANGED = 5
    REQUEST_DENIED = 6          # DOQ: a forwarded write past its deadline; a config change refused
    UNKNOWN_OUTCOME = 7


FAIL_TEXT: dict[int, str] = {
    RaftError.QUEUE_FULL: "raft command queue is full",
    RaftError.MISSING_LEADER: "leader address is empty",
    RaftError.DISCARDED: "leadership lost while committing log",
    RaftError.NOT_LEADER: "node is not the leader",
    RaftError.LEADER_CHANGED: "leadership lost while committing log",
    RaftError.REQUEST_DENIED: "refused: the write reached the leader after its deadline",
    RaftError.UNKNOWN_OUTCOME: "unknown outcome: the leader changed while committing",
}
# Failures after which the command may still be committed later.
MAYBE_APPLIED = {RaftError.LEADER_CHANGED, RaftError.UNKNOWN_OUTCOME}


class Proposer(Protocol):
    """What the service needs of replication."""

    @property
    def last_proposal(self) -> float:
        """time.monotonic() of the latest proposal."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def submit(self, op: C.Op, size: int | None = None) -> tuple[int, Any]:
        """Propose ``op`` (about ``size`` encoded bytes) and wait for its (code, value);
        raises Unavailable when it cannot be committed (its outcome may be unknown)."""

    def cut_off(self) -> str | None:
        """Why this node cannot take a write now (None: it can)."""

    def readiness(self) -> tuple[bool, str]:
        """Whether this node serves (``/readyz``), and why not."""

    @property
    def is_leader(self) -> bool: ...

    def member_addresses(self) -> set[str]: ...

    def status(self) -> dict[str, Any]: ...

    def stats(self) -> dict[str, int]: ...


class _Batch:
    __slots__ = ("ops", "waiters", "started", "settled", "bid", "expires_ms")

    def __init__(self) -> None:
        self.ops: list[C.Op] = []
        self.waiters: list[AsyncResult] = []
        self.started = time.monotonic()
        self.settled = False          # its callers have their answers
        self.bid = ""                 # batch id, travels with the entry
        self.expires_ms = 0           # its deadline in the log's clock


class Committer:
    """Group commit with a bounded number of Raft entries in flight."""

    def __init__(self, node: "RaftNode", clock: Clock, max_inflight: int, max_batch_bytes: int,
                 timeout: float, log_clock: Callable[[], int] = lambda: 0) -> None:
        self.node = node
        self.log_clock = log_clock            # the largest time the local log has applied
        self.clock = clock
        self.max_inflight = max_inflight
        self.max_batch_bytes = max_batch_bytes
        self.timeout = timeout
        self._pending: collections.deque[tuple[C.Op, AsyncResult, float, int]] = \
            collections.deque()
        self._wake = gevent.event.Event()
        self._slot_free = gevent.event.Event()
        self._inflight: dict[int, _Batch] = {}
        # Batches whose fate PySyncObj could not tell (the leader changed while a follower's
        # command was on its way): their callers keep waiting until the entry shows up in this
        # node's log (batch_applied) or they time out.
        self._orphans: dict[str, _Batch] = {}
        self._bid_prefix = os.urandom(6).hex()
        self._greenlets: list[gevent.Greenlet] = []
        self.entries_proposed = 0
        self.ops_proposed = 0
        self.last_proposal = 0.0

    def start(self) -> None:
        self._greenlets = [gevent.spawn(self._run), gevent.spawn(self._reap)]

    def stop(self) -> None:
        gevent.killall(self._greenlets, timeout=2)

    def submit(self, op: C.Op, size: int | None = None) -> tuple[int, Any]:
        """Queue ``op`` (of about ``size`` encoded bytes) and wait for its result."""
        waiter: AsyncResult = AsyncResult()
        deadline = time.monotonic() + self.timeout
        self._pending.append((op, waiter, deadline, size or C.op_size(op)))
        self._wake.set()
        try:
            return waiter.get(timeout=self.timeout)       # type: ignore[no-any-return]
        except gevent.Timeout:
            raise Unavailable("timed out enqueuing operation", maybe_applied=True) from None

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while self._pending:
                while len(self._inflight) >= self.max_inflight:
                    self._slot_free.clear()
                    self._slot_free.wait(0.5)
                batch = self._take()
                if not batch.ops:
                    continue
                try:
                    self._propose(batch)
                except Exception:  # noqa: BLE001 - never let one batch stop the committer
                    log.exception("proposing a batch failed")
                    self._settle(batch, InternalError("could not propose the operation"))

    def _take(self) -> _Batch:
        batch, size, now = _Batch(), 0, time.monotonic()
        pending = self._pending
        while pending and (size < self.max_batch_bytes or not batch.ops):
            op, waiter, deadline, op_bytes = pending.popleft()
            if now >= deadline or waiter.ready():
                continue                   # its caller gave up: never propose it late
            batch.ops.append(op)
            batch.waiters.append(waiter)
            size += op_bytes
        return batch

    def _propose(self, batch: _Batch) -> None:
        token = id(batch)
        self._inflight[token] = batch
        batch.bid = f"{self._bid_prefix}-{self.entries_proposed}"
        self.entries_proposed += 1
        self.ops_proposed += len(batch.ops)
        callback = functools.partial(self._committed, batch)
        now_ms = int(self.clock.now() * 1000)
        self.last_proposal = time.monotonic()
        try:
            # The entry must not take effect after its callers were told it failed: its
            # deadline comes before theirs, leaving time for a commit already under way.
            margin = min(1.0, self.timeout / 5)
            batch.expires_ms = now_ms + int((self.timeout - margin) * 1000)
            self.node.propose(batch.ops, now_ms, callback, batch.expires_ms, batch.bid)
        except Exception as exc:  # noqa: BLE001 - e.g. the node is shutting down
            self._settle(batch, Unavailable(f"cannot propose: {exc}"))

    def _committed(self, batch: _Batch, result: Any, error: int) -> None:
        if error in MAYBE_APPLIED:
            self._free_slot(batch)
            self._orphans[batch.bid] = batch
            return
        if error != 0:
            self._settle(batch, Unavailable(FAIL_TEXT.get(error, f"raft error {error}")))
            return
        if result is None:                       # the entry could not be decoded (codec.py)
            self._settle(batch, InternalError("the entry was skipped: it was not plain data"))
            return
        # A merged entry holds other batches too: this one's results, found by its id.
        result.add_callback(lambda results: self._deliver(batch, result.part(batch.bid, results)))

    def batch_applied(self, bid: str, results: list[tuple[int, Any]] | None) -> None:
        """This node applied the entry of batch ``bid`` (hook of the apply pipeline)."""
        batch = self._orphans.pop(bid, None)
        if batch is not None:
            self._deliver(batch, results)

    def _deliver(self, batch: _Batch, results: list[tuple[int, Any]] | None) -> None:
        if results is None:
            self._settle(batch, Unavailable("entry was applied before its result was known",
                                            maybe_applied=True))
            return
        if self._release(batch):
            for waiter, outcome in zip(batch.waiters, results):
                waiter.set(outcome)

    def _settle(self, batch: _Batch, error: DoqError) -> None:
        if self._release(batch):
            for waiter in batch.waiters:
                if not waiter.ready():
                    waiter.set_exception(error)

    def _free_slot(self, batch: _Batch) -> None:
        if self._inflight.pop(id(batch), None) is not None:
            self._slot_free.set()

    def _release(self, batch: _Batch) -> bool:
        self._free_slot(batch)
        if batch.settled:
            return False
        batch.settled = True
        return True

    def _reap(self) -> None:
        """Answer batches whose outcome never arrives (e.g. sent to a leader that died)."""
        while True:
            gevent.sleep(0.5)
            log_clock = self.log_clock()
            for batch in [b for b in self._orphans.values() if b.expires_ms < log_clock]:
                # This node's log has moved past the deadline without the entry: any later
                # copy of it will be refused, so this is a definite "no".
                self._orphans.pop(batch.bid, None)
                self._settle(batch, Unavailable("refused: the leader changed before the write "
                                                "was committed"))
            limit = time.monotonic() - self.timeout - 1
            stale = [b for b in self._inflight.values() if b.started < limit]
            stale += [b for b in self._orphans.values() if b.started < limit]
            for batch in stale:
                self._orphans.pop(batch.bid, None)
                self._settle(batch, Unavailable("timed out enqueuing operation",
                                                maybe_applied=True))

    def stats(self) -> dict[str, int]:
        return {"pending": len(self._pending), "inflight": len(self._inflight),
                "orphans": len(self._orphans), "entries_proposed": self.entries_proposed,
                "ops_proposed": self.ops_proposed}


class RaftProposer:
    """The proposer of a real node: the Raft node and its committer."""

    def __init__(self, node: "RaftNode", clock: Clock, max_inflight: int, max_batch_bytes: int,
                 timeout: float, freshness: float) -> None:
        self.node = node
        # How recently the leader (or a majority, on the leader) must have been heard from for
        # this node to accept a write: several heartbeats, far below the election timeout.
        self.freshness = freshness
        self.committer = Committer(node, clock, max_inflight, max_batch_bytes, timeout,
                                   lambda: node.pipeline.resolved_clock)
        node.pipeline.on_batch = self.committer.batch_applied

    @property
    def last_proposal(self) -> float:
        return self.committer.last_proposal

    def start(self) -> None:
        self.committer.start()

    def stop(self) -> None:
        self.committer.stop()

    def submit(self, op: C.Op, size: int | None = None) -> tuple[int, Any]:
        return self.committer.submit(op, size)

    def cut_off(self) -> str | None:
        node = self.node
        if node.leader_address is None:
            return "leader address is empty"
        if not node.has_quorum:
            return "no quorum: this node cannot reach a majority of the cluster"
        window = self.freshness
        if node.is_leader and not node.majority_recent(window):
            return "no quorum: a majority has not answered this leader lately"
        if not node.is_leader and node.leader_contact_age() > window:
            return "the leader has not been heard from lately"
        return None

    def readiness(self) -> tuple[bool, str]:
        node = self.node
        if node.leader_address is None:
            return False, "no leader"
        if not node.has_quorum:
            return False, "no quorum"
        cut_off = self.cut_off()
        if cut_off:
            return False, cut_off
        if not node.caught_up():
            return False, "catching up with the leader" if not node.is_leader else \
                "catching up: applying the log up to this leader's first commit"
        return True, "OK"

    @property
    def is_leader(self) -> bool:
        return bool(self.node.is_leader)

    def member_addresses(self) -> set[str]:
        return self.node.member_addresses()

    def status(self) -> dict[str, Any]:
        return self.node.status()

    def stats(self) -> dict[str, int]:
        return self.committer.stats()


class LocalProposer:
    """One node in memory that always leads: each operation is applied at once, as its own
    entry, through the real state machine (the time of the entry from ``clock``)."""

    def __init__(self, fsm: "StateMachine", clock: Clock, address: str = "local:0") -> None:
        self.fsm, self.clock, self.address = fsm, clock, address
        self.last_proposal = 0.0
        self.proposed = 0

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def submit(self, op: C.Op, size: int | None = None) -> tuple[int, Any]:
        self.last_proposal = time.monotonic()
        self.proposed += 1
        now_ms = int(self.clock.now() * 1000)
        [results] = self.fsm.apply_entries([(self.fsm.applied_index + 1, [op], now_ms, 0, "",
                                             None, RULES)])
        assert results is not None
        code, value = results[0]
        return int(code), value

    def cut_off(self) -> str | None:
        return None

    def readiness(self) -> tuple[bool, str]:
        return True, "OK"

    @property
    def is_leader(self) -> bool:
        return True

    def member_addresses(self) -> set[str]:
        return {self.address}

    def status(self) -> dict[str, Any]:
        return {"state": "leader", "term": 1, "commit_index": self.fsm.applied_index,
                "fsm_applied": self.fsm.applied_index, "leader": self.address}

    def stats(self) -> dict[str, int]:
        return {"pending": 0, "inflight": 0, "orphans": 0, "entries_proposed": self.proposed,
                "ops_proposed": self.proposed}
