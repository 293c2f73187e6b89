"""The deterministic state machine (L3).

``apply_entries`` applies committed Raft entries, each ``(index, ops, now_ms)``, to LMDB and to
the in-memory indexes. Rules that keep every replica identical:

* the only time is the command's ``now_ms`` (never run backwards: the largest seen is kept);
* ids, delivery choices and redelivery are computed here from state + command, never randomly;
* every entry's effects and its Raft index are written in the same LMDB transaction, and an
  entry whose index is not above the stored one is skipped (journal replay is idempotent);
* nothing raises out of here: each operation gets a ``(ResultCode, value)``. An operation that
  hits a bug is rolled back alone (nested transaction + reload of the in-memory state) and
  answered ``INTERNAL``; the others of its entry still apply.
"""
from __future__ import annotations

import heapq
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import lmdb

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from doq_lib.ids import id_time_ms, next_fsm_id
from doq_lib.lmdb_store import LmdbStore, LmdbTxn
from doq_lib.models import (
    DEFAULT_GROUP,
    LeaderConfig,
    MemberInfo,
    QueueDef,
    QueueSettings,
    QueueType,
    Strategy,
)
from doq_lib.queues.base import QueueIndex
from doq_lib.queues.delayed import DelayedIndex
from doq_lib.queues.fair import RoundRobinIndex
from doq_lib.queues.stats import QueueStats
from doq_lib.queues.weighted import WeightedIndex
from doq_lib.rules import FALLBACK_ACK_TIMEOUT, MIN_ACK_TIMEOUT, QUEUE_TYPES
from doq_lib.store import (
    TRACKED,
    TRACKED_NAMES,
    U64,
    decode_clock,
    decode_message,
    decode_message_head,
    decode_queue,
    decode_unacked,
    encode_clock,
    encode_message,
    encode_queue,
    encode_unacked,
    queue_key,
)

log = logging.getLogger(__name__)
INT63_MAX = (1 << 63) - 1

Result = tuple[int, Any]
# (raft index, ops, now_ms[, expires_ms[, batch id[, layout]]]); a merged entry's layout lists
# each batch's (operation count, expires_ms): its batches expire one by one.
Entry = tuple[Any, ...]
OK = ResultCode.OK
FAULT_CONTENT = "__doq_inject_fault__"


class InjectedFault(RuntimeError):
    """Raised inside an operation when fault injection is on (tests of bug containment)."""


def new_index(defn: QueueDef) -> QueueIndex:
    if defn.type is QueueType.DELAYED:
        return DelayedIndex()
    if defn.settings.strategy is Strategy.WEIGHTED:
        return WeightedIndex(defn.settings.max_unacked)
    return RoundRobinIndex(defn.settings.max_unacked)


class Unacked:
    """A delivered message waiting for its ack: when it is due back (unix ms), the group whose
    in-flight slot it holds, and the group and priority it returns with."""

    __slots__ = ("deadline", "slot", "group", "priority")

    def __init__(self, deadline: int, slot: str, group: str, priority: int) -> None:
        self.deadline, self.slot, self.group, self.priority = deadline, slot, group, priority


class QueueState:
    __slots__ = ("defn", "index", "unacked", "stats", "prefix", "deliverable_from", "oldest_ms")

    def __init__(self, defn: QueueDef, window: int) -> None:
        self.defn = defn
        self.index = new_index(defn)
        self.unacked: dict[int, Unacked] = {}
        self.stats = QueueStats(window)
        self.prefix = U64.pack(defn.qid)
        self.deliverable_from: int | None = None
        self.oldest_ms = 0            # time in the id of the oldest waiting message; 0: none

    def contains(self, mid: int) -> bool:
        return self.index.contains(mid) or mid in self.unacked

    def refresh_hint(self) -> None:
        """Publish when the queue has something deliverable (writer thread only).

        ``deliverable_from`` is the unix second from which a dequeue can succeed (None: nothing
        deliverable whatever the time). Other threads read this attribute for the dequeue fast
        path instead of touching the index, which only the writer thread may mutate.
        """
        index = self.index
        oldest = index.oldest_id()
        self.oldest_ms = id_time_ms(oldest) if oldest else 0
        if isinstance(index, DelayedIndex):
            self.deliverable_from = index.head_priority()
        else:
            self.deliverable_from = 0 if index.has_ready(0) else None


@dataclass
class _Ctx:
    txn: LmdbTxn
    now_ms: int
    now_s: int


class StateMachine:
    def __init__(self, store: LmdbStore, stats_window: int = 10,
                 fault_injection: bool = False, history_seconds: float = 86400.0) -> None:
        self.store = store
        self.history_ms = int(history_seconds * 1000)
        self.stats_window = stats_window
        self.fault_injection = fault_injection
        self.on_ready: Callable[[set[str]], None] | None = None   # wake-up hook
        self._woken: set[str] = set()
        self._touched: dict[str, QueueState] = {}
        self._handlers: dict[int, Callable[[_Ctx, Any], Result]] = {
            C.CREATE_QUEUE: self._create_queue, C.UPDATE_QUEUE: self._update_queue,
            C.DELETE_QUEUE: self._delete_queue, C.ENQUEUE: self._enqueue,
            C.DEQUEUE: self._dequeue, C.GET: self._get, C.DELETE: self._delete,
            C.ACK: self._ack, C.NACK: self._nack, C.TOUCH: self._touch,
            C.UPDATE_PRIORITY: self._update_priority, C.REQUEUE_EXPIRED: self._requeue_expired,
            C.LEADER_CONFIG: self._leader_config,
            C.MEMBER_INFO: self._member_info, C.MEMBER_FORGET: self._member_forget,
            C.TICK: lambda ctx, op: (OK, None),
            C.ENQUEUE_BATCH: self._enqueue_batch, C.DEQUEUE_MANY: self._dequeue_many,
            C.ACK_MANY: self._ack_many, C.ENQUEUE_SEQ: self._enqueue_seq,
            C.RESTORE_BEGIN: self._restore_begin, C.RESTORE_PUT: self._restore_put,
            C.RESTORE_COMMIT: self._restore_commit, C.RESTORE_ABORT: self._restore_abort,
            C.ACK_IDS: self._ack_ids, C.NACK_IDS: self._nack_ids,
        }
        self._reset()
        with store.read() as txn:
            self._load(txn)

    # -- state ---------------------------------------------------------------------------------
    def _reset(self) -> None:
        self.queues: dict[str, QueueState] = {}
        self.by_qid: dict[int, QueueState] = {}
        self.deadlines: list[tuple[int, int, int]] = []      # (deadline_ms, qid, id), lazy
        self.applied_index = 0
        self.last_now_ms = 0
        self.last_id = 0
        self.next_qid = 1
        self.leader: LeaderConfig | None = None
        self.members: dict[str, MemberInfo] = {}           # raft address -> member

    def reload(self, txn: LmdbTxn) -> None:
        """Rebuild all in-memory state from ``txn`` (after a snapshot image was installed)."""
        self._load(txn)

    def _load(self, txn: LmdbTxn) -> None:
        """Rebuild every in-memory index from the store (start-up, snapshot install, rollback)."""
        old_stats = {name: qs.stats for name, qs in getattr(self, "queues", {}).items()}
        self._reset()
        meta = dict(txn.items("meta"))
        self.applied_index = U64.unpack(meta[b"applied"])[0] if b"applied" in meta else 0
        self.restored_version = U64.unpack(meta[b"restored"])[0] if b"restored" in meta else None
        if not hasattr(self, "_history_fresh"):
            self._history_fresh = self.applied_index == 0
        self.last_now_ms, self.last_id = decode_clock(meta.get(b"clock"))
        self.next_qid = U64.unpack(meta[b"next_qid"])[0] if b"next_qid" in meta else 1
        if b"leader" in meta:
            self.leader = LeaderConfig(**json.loads(meta[b"leader"]))
        if b"members" in meta:
            self.members = {addr: MemberInfo(**info)
                            for addr, info in json.loads(meta[b"members"]).items()}
        for key, raw in list(txn.items("queues")):
            qs = QueueState(decode_queue(key.decode(errors="replace"), raw), self.stats_window)
            if qs.defn.name in old_stats:
                qs.stats = old_stats[qs.defn.name]
            self._load_queue(txn, qs)
            qs.refresh_hint()
            self.queues[qs.defn.name] = qs
            self.by_qid[qs.defn.qid] = qs
        heapq.heapify(self.deadlines)

    def _load_queue(self, txn: LmdbTxn, qs: QueueState) -> None:
        index, prefix, qid = qs.index, qs.prefix, qs.defn.qid
        index.load_records([(k[8:], v) for k, v in txn.items("sched", prefix)])
        unacked = {U64.unpack(k[8:])[0]: decode_unacked(v) for k, v in txn.items("unacked", prefix)}
        for key, raw in txn.items("messages", prefix):
            mid = U64.unpack(key[8:])[0]
            priority, group = decode_message_head(raw)
            if mid in unacked:
                deadline, slot = unacked[mid]
                qs.unacked[mid] = Unacked(deadline, slot, group, priority)
                self.deadlines.append((deadline, qid, mid))
                index.inflight_add(slot)
            else:
                index.add(mid, group, priority)
        finish = getattr(index, "finish_load", None)
        if finish is not None:
            finish()
        if index.drain_changes():
            log.warning("queue %r: scheduler records were incomplete on load", qs.defn.name)

    # -- applying --------------------------------------------------------------------------------
    def apply_entries(self, entries: Iterable[Entry],
                      early: Callable[[list[list[Result] | None]], None] | None = None,
                      ) -> list[list[Result] | None]:
        """Apply entries in one transaction; returns per-entry results (None = already applied).

        ``early`` receives the results once they are final but before the transaction commits:
        the entries are already durable in the Raft journal of a majority, and replaying them
        after a crash reproduces exactly these results, so callers may be answered without
        waiting for the store's own fsync. A commit that fails after that point is fatal.
        """
        entries = list(entries)
        todo = [e for e in entries if e[0] > self.applied_index]
        if not todo:
            results: list[list[Result] | None] = [None] * len(entries)
            if early is not None:
                early(results)
            return results
        attempt = self._apply_fast
        released = False
        while True:
            try:
                with self.store.write() as txn:
                    done = attempt(txn, todo)
                    self._publish_hints()
                    by_index = dict(zip((e[0] for e in todo), done))
                    results = [by_index.get(e[0]) for e in entries]
                    if early is not None:
                        released = True
                        early(results)
                break
            except lmdb.MapFullError:
                self._after_failed_txn(released)
                self.store.grow()
            except Exception:  # noqa: BLE001 - a bug: contain it, never wedge the log
                log.exception("applying entries %d..%d failed; isolating operations",
                              todo[0][0], todo[-1][0])
                self._after_failed_txn(released)
                attempt = self._apply_isolated
        self._fire_wakeups()
        return results

    def _after_failed_txn(self, released: bool) -> None:
        if released:
            # Callers already saw these results; memory and disk can no longer be reconciled
            # here. Restarting replays the journal and reproduces them.
            log.critical("store commit failed after results were released; exiting")
            os._exit(70)
        self._rollback()

    def _live(self, entry: Entry) -> list[bool] | None:
        """None when every operation of ``entry`` may apply; else per operation, False where
        its batch committed after its proposer's deadline (checked against the clock before
        this entry; one batch per entry unless merged)."""
        ops = entry[1]
        layout = entry[5] if len(entry) > 5 else [(len(ops), entry[3] if len(entry) > 3 else 0)]
        clock = self.last_now_ms
        if not any(expires and expires < clock for _, expires in layout):
            return None
        live: list[bool] = []
        for count, expires in layout:
            live.extend([not (expires and expires < clock)] * count)
        return live

    def _apply_fast(self, txn: LmdbTxn, entries: list[Entry]) -> list[list[Result]]:
        out: list[list[Result]] = []
        expired: Result = (ResultCode.EXPIRED, None)
        for entry in entries:
            index, ops, now_ms = entry[:3]
            self._track(index)
            live = self._live(entry)
            if live is None:
                ctx = self._begin(txn, now_ms)
                out.append([self._apply_op(ctx, op) for op in ops])
            elif any(live):
                ctx = self._begin(txn, now_ms)
                out.append([self._apply_op(ctx, op) if ok else expired
                            for op, ok in zip(ops, live)])
            else:
                out.append([expired] * len(ops))
            self._finish(txn, index)
        return out

    def _apply_isolated(self, txn: LmdbTxn, entries: list[Entry]) -> list[list[Result]]:
        out: list[list[Result]] = []
        for entry in entries:
            index, ops, now_ms = entry[:3]
            self._track(index)
            live = self._live(entry) or [True] * len(ops)
            if not any(live):
                out.append([(ResultCode.EXPIRED, None)] * len(ops))
                self._finish(txn, index)
                continue
            results: list[Result] = []
            for op, ok in zip(ops, live):
                if not ok:
                    results.append((ResultCode.EXPIRED, None))
                    continue
                try:
                    with self.store.child(txn) as child:
                        results.append(self._apply_op(self._begin(child, now_ms), op))
                        child.put("meta", b"clock", encode_clock(self.last_now_ms, self.last_id))
                except Exception:  # noqa: BLE001 - the bug is contained to this op
                    log.exception("operation %s failed at entry %d; rolled back",
                                  C.name_of(op), index)
                    self._load(txn)
                    results.append((ResultCode.INTERNAL, "internal error"))
            out.append(results)
            self._begin(txn, now_ms)    # a rolled-back op must not undo the entry's clock
            self._finish(txn, index)
        return out

    def _rollback(self) -> None:
        self._woken.clear()
        self._touched.clear()
        with self.store.read() as txn:
            self._load(txn)

    def _begin(self, txn: LmdbTxn, now_ms: int) -> _Ctx:
        if now_ms > self.last_now_ms:
            self.last_now_ms = now_ms
        now = self.last_now_ms
        return _Ctx(txn, now, now // 1000)

    def _track(self, index: int) -> None:
        """Changes from here on belong to version ``index`` (the change history)."""
        changelog = self.store.changelog
        changelog.version = index
        changelog.pending = []

    def _finish(self, txn: LmdbTxn, index: int) -> None:
        txn.put("meta", b"clock", encode_clock(self.last_now_ms, self.last_id))
        txn.put("meta", b"applied", U64.pack(index))
        self.applied_index = index
        added = txn.flush_changes()
        self.store.changelog.version = 0
        if added:
            txn.history_mark(index, self.last_now_ms)
            if txn.history_from() is None:
                txn.set_history_from(1 if self._history_fresh else index)
            # Prune faster than records arrive, a bounded amount per entry.
            txn.prune_history(self.last_now_ms - self.history_ms, 2 * added + 8)

    def _apply_op(self, ctx: _Ctx, op: C.Op) -> Result:
        try:
            code, view = C.decode(op)
        except C.Malformed as exc:
            return ResultCode.BAD_COMMAND, str(exc)
        return self._handlers[code](ctx, view)

    def _publish_hints(self) -> None:
        touched, self._touched = self._touched, {}
        for qs in touched.values():
            qs.refresh_hint()

    def _fire_wakeups(self) -> None:
        woken, self._woken = self._woken, set()
        if woken and self.on_ready is not None:
            self.on_ready(woken)

    def _flush_sched(self, ctx: _Ctx, qs: QueueState) -> None:
        for key, value in qs.index.drain_changes():
            if value is None:
                ctx.txn.delete("sched", qs.prefix + key)
            else:
                ctx.txn.put("sched", qs.prefix + key, value)

    # -- queue operations ------------------------------------------------------------------------
    def _create_queue(self, ctx: _Ctx, op: C.CreateQueue) -> Result:
        name = op.name
        if name in self.queues:
            return OK, None
        problem, settings = _create_settings(op.type, op.strategy, op.max_unacked,
                                             op.ack_timeout,
                                             _default_timeout(op.default_ack_timeout))
        if problem:
            return ResultCode.INVALID_SETTINGS, problem
        defn = QueueDef(name, self.next_qid, QueueType(op.type), settings)
        self.next_qid += 1
        ctx.txn.put("meta", b"next_qid", U64.pack(self.next_qid))
        ctx.txn.put("queues", queue_key(name), encode_queue(defn))
        qs = QueueState(defn, self.stats_window)
        self.queues[name] = qs
        self.by_qid[defn.qid] = qs
        return OK, None

    def _update_queue(self, ctx: _Ctx, op: C.UpdateQueue) -> Result:
        name, strategy, max_unacked, ack_timeout = \
            op.name, op.strategy, op.max_unacked, op.ack_timeout
        qs = self._queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        current = qs.defn.settings
        if strategy and strategy != current.strategy:
            return ResultCode.INVALID_SETTINGS, "invalid queue settings"
        if 0 < ack_timeout < MIN_ACK_TIMEOUT:
            return ResultCode.INVALID_SETTINGS, "invalid ack timeout"
        fair = qs.defn.type is QueueType.FAIR
        settings = QueueSettings(current.strategy, max_unacked if fair else 0,
                                 ack_timeout or _default_timeout(op.default_ack_timeout))
        qs.defn = QueueDef(name, qs.defn.qid, qs.defn.type, settings)
        ctx.txn.put("queues", queue_key(name), encode_queue(qs.defn))
        if fair and settings.max_unacked != current.max_unacked:
            qs.index.set_max_unacked(settings.max_unacked)
            self._flush_sched(ctx, qs)       # unblocked groups may have moved scheduler state
            if qs.index.has_ready(ctx.now_s):
                self._woken.add(name)
        return OK, None

    def _delete_queue(self, ctx: _Ctx, op: C.DeleteQueue) -> Result:
        qs = self.queues.pop(op.name, None)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        del self.by_qid[qs.defn.qid]
        for db in ("messages", "unacked", "sched"):
            ctx.txn.delete_prefix(db, qs.prefix)
        ctx.txn.delete("queues", queue_key(op.name))
        return OK, None

    def _leader_config(self, ctx: _Ctx, op: C.LeaderConfig) -> Result:
        self.leader = LeaderConfig(op.node_id, op.raft_addr, op.grpc_addr, op.http_addr)
        ctx.txn.put("meta", b"leader", json.dumps(self.leader.__dict__, sort_keys=True).encode())
        return OK, None

    def _member_info(self, ctx: _Ctx, op: C.MemberInfo) -> Result:
        node_id, raft_addr = op.node_id, op.raft_addr
        members = dict(self.members)
        for addr, member in self.members.items():      # one entry per id and per address
            if member.node_id == node_id and addr != raft_addr:
                del members[addr]
        members[raft_addr] = MemberInfo(node_id, raft_addr, op.http_addr, op.grpc_addr)
        self._store_members(ctx, members)
        return OK, None

    def _member_forget(self, ctx: _Ctx, op: C.MemberForget) -> Result:
        members = dict(self.members)
        members.pop(op.raft_addr, None)
        self._store_members(ctx, members)
        return OK, None

    def _store_members(self, ctx: _Ctx, members: dict[str, MemberInfo]) -> None:
        encoded = {addr: m.__dict__ for addr, m in sorted(members.items())}
        ctx.txn.put("meta", b"members", json.dumps(encoded, sort_keys=True).encode())
        self.members = members

    # -- restore (chunks staged through the log, then applied in one step) ------------------------
    def _restore_token(self, ctx: _Ctx) -> str:
        raw = ctx.txn.get("meta", b"restore")
        return raw.decode() if raw else ""

    def _restore_begin(self, ctx: _Ctx, op: C.RestoreToken) -> Result:
        ctx.txn.clear_staging()
        ctx.txn.put("meta", b"restore", op.token.encode())
        return OK, None

    def _restore_put(self, ctx: _Ctx, op: C.RestorePut) -> Result:
        records = op.records
        if self._restore_token(ctx) != op.token:
            return ResultCode.RESTORE_CONFLICT, "another restore started since; this one stopped"
        for code, key, value in records:
            if code not in TRACKED_NAMES:
                return ResultCode.BAD_COMMAND, f"unknown database code {code}"
            ctx.txn.stage(code, key, value)
        return OK, len(records)

    def _restore_commit(self, ctx: _Ctx, op: C.RestoreCommit) -> Result:
        full, since, last_version, last_id, next_qid = \
            op.full, op.since, op.last_version, op.last_id, op.next_qid
        txn = ctx.txn
        if self._restore_token(ctx) != op.token:
            return ResultCode.RESTORE_CONFLICT, "another restore started since; this one stopped"
        if not (0 <= last_id <= INT63_MAX and 1 <= next_qid <= INT63_MAX):
            return ResultCode.BAD_COMMAND, "restore counters out of range"
        if not full and self.restored_version != since - 1:
            ended = ("no restore was made here" if self.restored_version is None
                     else f"the last restore here ended at version {self.restored_version}")
            return ResultCode.RESTORE_CONFLICT, (
                f"an incremental backup from version {since} must follow the restore that "
                f"ended at version {since - 1}, but {ended}")
        if full:
            for name in TRACKED:
                txn.delete_prefix(name, b"")
        for code, key, value in txn.staged():
            name = TRACKED_NAMES[code]
            if value is None:
                txn.delete(name, key)
            else:
                txn.put(name, key, value)
        txn.clear_staging()
        txn.delete("meta", b"restore")
        txn.put("meta", b"restored", U64.pack(last_version))
        self.last_id = max(self.last_id, last_id)
        txn.put("meta", b"clock", encode_clock(self.last_now_ms, self.last_id))
        txn.put("meta", b"next_qid", U64.pack(max(self.next_qid, next_qid)))
        self._load(txn)                         # every in-memory index from the new state
        self._touched.clear()
        self._woken.update(self.queues)
        return OK, {"queues": len(self.queues)}

    def _restore_abort(self, ctx: _Ctx, op: C.RestoreToken) -> Result:
        if self._restore_token(ctx) == op.token:
            ctx.txn.clear_staging()
            ctx.txn.delete("meta", b"restore")
        return OK, None

    # -- message operations ----------------------------------------------------------------------
    def _queue(self, name: str) -> QueueState | None:
        qs = self.queues.get(name)
        if qs is not None:
            self._touched[name] = qs
        return qs

    def _new_id(self, qs: QueueState, now_ms: int) -> int:
        mid = next_fsm_id(self.last_id, now_ms)
        while qs.contains(mid):
            mid = next_fsm_id(mid, now_ms)
        self.last_id = mid
        return mid

    def _enqueue(self, ctx: _Ctx, op: C.Enqueue) -> Result:
        name, mid, group, priority = op.queue, op.id, op.group, op.priority
        content, metadata = op.content, op.metadata
        qs = self._queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if qs.defn.type is QueueType.DELAYED or not group:
            group = DEFAULT_GROUP
        if not mid:
            mid = self._new_id(qs, ctx.now_ms)
        ctx.txn.put("messages", qs.prefix + U64.pack(mid),
                    encode_message(priority, group, content, metadata))
        index = qs.index
        if index.contains(mid):                      # a duplicate id: overwrite, reposition
            if index.group_of(mid) == group:
                index.reprioritize(mid, priority)
            else:
                index.remove(mid)
                index.add(mid, group, priority)
        elif mid in qs.unacked:                      # stays delivered; new values on return
            entry = qs.unacked[mid]
            entry.group, entry.priority = group, priority
        else:
            index.add(mid, group, priority)
            qs.stats.count("enqueue", ctx.now_s)
            self._woken.add(name)
        if self.fault_injection and content == FAULT_CONTENT:
            raise InjectedFault("injected fault in enqueue")
        self._flush_sched(ctx, qs)
        return OK, (mid, group, priority, content, metadata or {})

    def _dequeue(self, ctx: _Ctx, op: C.Dequeue) -> Result:
        name, ack = op.queue, op.ack
        qs = self._queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        index = qs.index
        mid = index.pop(ctx.now_s, hold=not ack)
        if mid is None:
            return ResultCode.QUEUE_EMPTY, None
        key = qs.prefix + U64.pack(mid)
        raw = ctx.txn.get("messages", key)
        priority, group, content, metadata = decode_message(raw)  # type: ignore[arg-type]
        if ack:
            ctx.txn.delete("messages", key)
        else:
            slot = group if qs.defn.type is QueueType.FAIR else DEFAULT_GROUP
            deadline = ctx.now_ms + qs.defn.settings.ack_timeout * 1000
            qs.unacked[mid] = Unacked(deadline, slot, group, priority)
            ctx.txn.put("unacked", key, encode_unacked(deadline, slot))
            heapq.heappush(self.deadlines, (deadline, qs.defn.qid, mid))
        qs.stats.count("dequeue", ctx.now_s)
        self._flush_sched(ctx, qs)
        return OK, (mid, group, priority, content, metadata)

    def _enqueue_batch(self, ctx: _Ctx, op: C.Items) -> Result:
        items = C.items_of(op)
        for item in items:
            if item.queue not in self.queues:
                return ResultCode.QUEUE_NOT_FOUND, item.queue
        values = []
        for item in items:
            _, value = self._enqueue(ctx, item)
            values.append(value)
        return OK, values

    def _enqueue_seq(self, ctx: _Ctx, op: C.Items) -> Result:
        values: list[Any] = []
        for item in C.items_of(op):
            code, value = self._enqueue(ctx, item)
            if code != OK:
                return OK, (values, (code, item.queue))
            values.append(value)
        return OK, (values, None)

    def _dequeue_many(self, ctx: _Ctx, op: C.DequeueMany) -> Result:
        one = C.Dequeue(op.queue, op.ack)
        values: list[Any] = []
        for _ in range(max(1, op.max_count)):
            code, value = self._dequeue(ctx, one)
            if code != OK:
                return (code, None) if not values else (OK, values)
            values.append(value)
        return OK, values

    def _ack_many(self, ctx: _Ctx, op: C.Ids) -> Result:
        code, failed = self._ack_ids(ctx, op)
        return code, None if failed is None else [mid for mid, _ in failed]

    def _settle_ids(self, ctx: _Ctx, name: str, ids: list[int],
                    settle: Callable[[int], Result]) -> Result:
        qs = self._queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        failed: list[tuple[int, int]] = []
        for mid in ids:
            code = settle(mid)[0]
            if code != OK:
                failed.append((mid, int(code if qs.contains(mid)
                                        else ResultCode.MESSAGE_NOT_FOUND)))
        return OK, failed

    def _ack_ids(self, ctx: _Ctx, op: C.Ids) -> Result:
        name = op.queue
        return self._settle_ids(ctx, name, op.ids, lambda mid: self._ack_one(ctx, name, mid))

    def _nack_ids(self, ctx: _Ctx, op: C.NackIds) -> Result:
        name, priority, metadata = op.queue, op.priority, op.metadata
        return self._settle_ids(ctx, name, op.ids, lambda mid: self._nack_one(
            ctx, name, mid, priority, metadata))

    def _get(self, ctx: _Ctx, op: C.MessageRef) -> Result:
        name, mid = op.queue, op.id
        qs = self._queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if not qs.contains(mid):
            return ResultCode.MESSAGE_NOT_FOUND, None
        raw = ctx.txn.get("messages", qs.prefix + U64.pack(mid))
        priority, group, content, metadata = decode_message(raw)  # type: ignore[arg-type]
        return OK, (mid, group, priority, content, metadata)

    def _delete(self, ctx: _Ctx, op: C.MessageRef) -> Result:
        name, mid = op.queue, op.id
        qs = self._queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        key = qs.prefix + U64.pack(mid)
        if qs.index.remove(mid):
            ctx.txn.delete("messages", key)
        elif mid in qs.unacked:
            entry = qs.unacked.pop(mid)
            ctx.txn.delete("messages", key)
            ctx.txn.delete("unacked", key)
            self._release_slot(qs, entry.slot, ctx)
        else:
            return ResultCode.MESSAGE_NOT_FOUND, None
        self._flush_sched(ctx, qs)
        return OK, None

    def _release_slot(self, qs: QueueState, slot: str, ctx: _Ctx) -> None:
        qs.index.inflight_remove(slot)
        if qs.defn.type is QueueType.FAIR and qs.index.has_ready(ctx.now_s):
            self._woken.add(qs.defn.name)

    def _take_unacked(self, queue: str, mid: int) -> tuple[QueueState | None, Unacked | None]:
        qs = self._queue(queue)
        if qs is None:
            return None, None
        return qs, qs.unacked.get(mid)

    def _ack(self, ctx: _Ctx, op: C.MessageRef) -> Result:
        return self._ack_one(ctx, op.queue, op.id)

    def _ack_one(self, ctx: _Ctx, name: str, mid: int) -> Result:
        qs, entry = self._take_unacked(name, mid)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if entry is None:
            return ResultCode.NOT_UNACKED, None
        del qs.unacked[mid]
        key = qs.prefix + U64.pack(mid)
        ctx.txn.delete("messages", key)
        ctx.txn.delete("unacked", key)
        self._release_slot(qs, entry.slot, ctx)
        qs.stats.count("ack", ctx.now_s)
        self._flush_sched(ctx, qs)
        return OK, None

    def _nack(self, ctx: _Ctx, op: C.Nack) -> Result:
        return self._nack_one(ctx, op.queue, op.id, op.priority, op.metadata)

    def _nack_one(self, ctx: _Ctx, name: str, mid: int, priority: int,
                  metadata: dict[str, str] | None) -> Result:
        qs, entry = self._take_unacked(name, mid)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if entry is None:
            return ResultCode.NOT_UNACKED, None
        del qs.unacked[mid]
        key = qs.prefix + U64.pack(mid)
        ctx.txn.delete("unacked", key)
        new_priority = priority or entry.priority
        if new_priority != entry.priority or metadata is not None:
            raw = ctx.txn.get("messages", key)
            _, group, content, old_meta = decode_message(raw)  # type: ignore[arg-type]
            meta = old_meta if metadata is None else metadata
            ctx.txn.put("messages", key, encode_message(new_priority, group, content, meta))
        qs.index.add(mid, entry.group, new_priority)
        qs.index.inflight_remove(entry.slot)
        qs.stats.count("nack", ctx.now_s)
        self._woken.add(name)
        self._flush_sched(ctx, qs)
        return OK, (new_priority, metadata)

    def _touch(self, ctx: _Ctx, op: C.MessageRef) -> Result:
        qs, entry = self._take_unacked(op.queue, op.id)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if entry is None:
            return ResultCode.NOT_UNACKED, None
        entry.deadline = ctx.now_ms + qs.defn.settings.ack_timeout * 1000
        ctx.txn.put("unacked", qs.prefix + U64.pack(op.id),
                    encode_unacked(entry.deadline, entry.slot))
        heapq.heappush(self.deadlines, (entry.deadline, qs.defn.qid, op.id))
        return OK, None

    def _update_priority(self, ctx: _Ctx, op: C.UpdatePriority) -> Result:
        name, mid, priority = op.queue, op.id, op.priority
        qs = self._queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if qs.index.contains(mid):
            qs.index.reprioritize(mid, priority)
        elif mid in qs.unacked:
            qs.unacked[mid].priority = priority
        else:
            return ResultCode.MESSAGE_NOT_FOUND, None
        key = qs.prefix + U64.pack(mid)
        _, group, content, metadata = decode_message(ctx.txn.get("messages", key))  # type: ignore[arg-type]
        ctx.txn.put("messages", key, encode_message(priority, group, content, metadata))
        self._flush_sched(ctx, qs)
        return OK, None

    def _requeue_expired(self, ctx: _Ctx, op: C.NoFields) -> Result:
        heap, count = self.deadlines, 0
        touched: dict[str, QueueState] = {}
        while heap and heap[0][0] <= ctx.now_ms:
            deadline, qid, mid = heapq.heappop(heap)
            qs = self.by_qid.get(qid)
            if qs is None:
                continue                                      # the queue was deleted
            entry = qs.unacked.get(mid)
            if entry is None or entry.deadline != deadline:
                continue                                      # acked, touched or deleted
            del qs.unacked[mid]
            ctx.txn.delete("unacked", qs.prefix + U64.pack(mid))
            qs.index.add(mid, entry.group, entry.priority)
            qs.index.inflight_remove(entry.slot)
            qs.stats.redelivered += 1
            touched[qs.defn.name] = qs
            self._touched[qs.defn.name] = qs
            count += 1
        for name, qs in touched.items():
            self._flush_sched(ctx, qs)
            self._woken.add(name)
        return OK, count

    # -- read-only views (any thread) -------------------------------------------------------------
    def next_deadline_ms(self) -> int | None:
        """Earliest ack deadline in the heap, for the leader's redelivery timer.

        May name an entry that was acked or touched since: the requeue it triggers finds nothing
        to do and drops the stale head.
        """
        try:
            return self.deadlines[0][0]
        except IndexError:
            return None


def _default_timeout(carried: int) -> int:
    """The proposer's configured default ack timeout, carried in the op (any value >= 1;
    0 in an operation from before it was carried)."""
    return int(carried) if carried else FALLBACK_ACK_TIMEOUT


def _create_settings(qtype: str, strategy: int, max_unacked: int, ack_timeout: int,
                     default_timeout: int = FALLBACK_ACK_TIMEOUT,
                     ) -> tuple[str | None, QueueSettings]:
    if qtype not in QUEUE_TYPES:
        return "invalid queue type", QueueSettings()
    if 0 < ack_timeout < MIN_ACK_TIMEOUT:
        return "invalid ack timeout", QueueSettings()
    timeout = ack_timeout or default_timeout
    if qtype == "delayed":
        if strategy:
            return "invalid strategy", QueueSettings()
        if max_unacked:
            return "invalid max unacked", QueueSettings()
        return None, QueueSettings(Strategy.STRATEGY_UNSPECIFIED, 0, timeout)
    if strategy not in (0, 1, 2):
        return "invalid strategy", QueueSettings()
    return None, QueueSettings(Strategy(strategy or Strategy.ROUND_ROBIN), max_unacked, timeout)
