"""The state machine: applying committed entries, loading, the read API (L3)."""
from __future__ import annotations

import heapq
import json
import logging
import os
from typing import Any, Callable, Iterable, Iterator

import lmdb

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from doq_lib.fsm import consumers, schedules
from doq_lib.fsm.base import MachineState
from doq_lib.fsm.controls import ControlOps
from doq_lib.fsm.inspect import BrowseJob, Explained, ExplainJob, InspectOps, Listed
from doq_lib.fsm.lifecycle import LifecycleOps
from doq_lib.fsm.limits import LimitOps
from doq_lib.fsm.membership import MembershipOps
from doq_lib.fsm.messages import MessageOps
from doq_lib.fsm.queues import QueueOps
from doq_lib.fsm.restore import RestoreOps
from doq_lib.fsm.schedules import ScheduleOps, ScheduleView
from doq_lib.fsm.state import (
    MISSING,
    OK,
    Ctx,
    Entry,
    Missing,
    QueueCounters,
    QueueState,
    Result,
    Unacked,
    entry_rules,
    info_of,
)
from doq_lib.lmdb_store import LmdbStore, LmdbTxn
from doq_lib.models import GroupInfo, LeaderConfig, MemberInfo, QueueDef, QueueInfo
from doq_lib.queues.base import paused_match
from doq_lib.store import (
    U64,
    decode_attempts,
    decode_clock,
    decode_dedup,
    decode_message_head,
    decode_queue,
    decode_unacked,
    encode_clock,
)

log = logging.getLogger(__name__)


class StateMachine(MachineState):
    """Applies committed entries to the store and the in-memory indexes; answers reads.

    It owns the state (:class:`~doq_lib.fsm.base.MachineState`) and one object per kind of
    operation, each given the state and the parts it uses: ``definitions`` (queues),
    ``messages``, ``lifecycle`` (ids, dead letters, expiry, holds, dedup), ``limits`` (rates,
    in-flight), ``controls`` (purge, pause), ``membership``, ``restores``, ``schedules`` and
    ``inspector`` (browse, explain). :meth:`apply_entries` routes each operation to its
    part's handler."""

    def __init__(self, store: LmdbStore, stats_window: int = 10,
                 fault_injection: bool = False, history_seconds: float = 86400.0) -> None:
        self.store = store
        self.history_ms = int(history_seconds * 1000)
        self.stats_window = stats_window
        self.fault_injection = fault_injection
        self.on_ready: Callable[[set[str]], None] | None = None   # wake-up hook
        # runs a read that walks the indexes where no apply runs meanwhile: the caller's
        # thread, or the writer thread with raft.apply_in_thread (set by the apply pipeline)
        self.serialize: Callable[[Callable[[], Any]], Any] = lambda read: read()
        self.woken: set[str] = set()
        self.touched: dict[str, QueueState] = {}
        self.lifecycle = LifecycleOps(self)
        self.limits = LimitOps(self)
        self.messages = MessageOps(self, self.lifecycle, self.limits)
        self.controls = ControlOps(self, self.lifecycle)
        self.definitions = QueueOps(self, self.limits)
        self.membership = MembershipOps(self)
        self.restores = RestoreOps(self, self._load)
        self.schedules = ScheduleOps(self, self.messages.enqueue)
        self.inspector = InspectOps(self)
        definitions, messages, lifecycle, controls = \
            self.definitions, self.messages, self.lifecycle, self.controls
        membership, restores, schedules_ = self.membership, self.restores, self.schedules
        self._handlers: dict[int, Callable[[Ctx, Any], Result]] = {
            C.CREATE_QUEUE: definitions.create_queue, C.UPDATE_QUEUE: definitions.update_queue,
            C.DELETE_QUEUE: definitions.delete_queue,
            C.ENQUEUE: messages.enqueue, C.ENQUEUE_BATCH: messages.enqueue_batch,
            C.ENQUEUE_SEQ: messages.enqueue_seq, C.DEQUEUE: messages.dequeue,
            C.DEQUEUE_MANY: messages.dequeue_many, C.GET: messages.get, C.DELETE: messages.delete,
            C.ACK: messages.ack, C.ACK_MANY: messages.ack_many, C.ACK_IDS: messages.ack_ids,
            C.NACK: messages.nack, C.NACK_IDS: messages.nack_ids, C.TOUCH: messages.touch,
            C.REJECT: messages.reject_op, C.UPDATE_PRIORITY: messages.update_priority,
            C.REQUEUE_EXPIRED: messages.requeue_expired,
            C.REDRIVE: lifecycle.redrive, C.PURGE: controls.purge,
            C.SET_PAUSED: controls.set_paused,
            C.LEADER_CONFIG: membership.leader_config, C.MEMBER_INFO: membership.member_info,
            C.MEMBER_FORGET: membership.member_forget, C.CLUSTER_ID: membership.cluster_id,
            C.RESTORE_BEGIN: restores.begin, C.RESTORE_PUT: restores.put,
            C.RESTORE_COMMIT: restores.commit, C.RESTORE_ABORT: restores.abort,
            C.SCHEDULE_PUT: schedules_.put, C.SCHEDULE_DELETE: schedules_.delete,
            C.SCHEDULE_PAUSE: schedules_.pause, C.SCHEDULE_FIRE: schedules_.fire,
            C.TICK: lambda ctx, op: (OK, None),
        }
        self._reset()
        with store.read() as txn:
            self._load(txn)

    def _reset(self) -> None:
        self.queues: dict[str, QueueState] = {}
        self.by_qid: dict[int, QueueState] = {}
        self.deadlines: list[tuple[int, int, int]] = []      # (deadline_ms, qid, id), lazy
        self.holds: list[tuple[int, int, int]] = []          # (not before ms, qid, id), lazy
        self.limit_events: list[tuple[int, int]] = []        # (unix µs, qid): rate events
        # (first expiry ms, qid) of each queue with TTL messages, lazy: an index of this
        # node's only (LifecycleOps.expiry_due), never read by an operation
        self.expiry_heads: list[tuple[int, int]] = []
        self.applied_index = 0
        self.last_now_ms = 0
        self.last_id = 0
        self.next_qid = 1
        self.leader: LeaderConfig | None = None
        self.members: dict[str, MemberInfo] = {}           # raft address -> member
        self.cluster_id = ""                                 # "" until the first leader names it
        self.scheduled: dict[str, QueueState] = {}           # queues with schedules

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
        self.cluster_id = meta.get(b"cluster_id", b"").decode("ascii", "replace")
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
            if qs.schedules:
                self.scheduled[qs.defn.name] = qs
        heapq.heapify(self.deadlines)
        heapq.heapify(self.holds)
        heapq.heapify(self.limit_events)
        heapq.heapify(self.expiry_heads)

    def _load_queue(self, txn: LmdbTxn, qs: QueueState) -> None:
        index, prefix, qid = qs.index, qs.prefix, qs.defn.qid
        index.load_records([(k[8:], v) for k, v in txn.items("sched", prefix)])
        unacked = {U64.unpack(k[8:])[0]: decode_unacked(v) for k, v in txn.items("unacked", prefix)}
        not_before: dict[int, int] = {}
        for k, v in txn.items("attempts", prefix):
            mid = U64.unpack(k[8:])[0]
            deliveries, error, until = decode_attempts(v)
            qs.attempts[mid] = (deliveries, error)
            if until:
                not_before[mid] = until
        for raw_key, value in txn.items("dedup", prefix):
            name = raw_key[8:]
            qs.dedup[name] = first = decode_dedup(value)
            qs.dedup_order.append((first[1], name))
        heapq.heapify(qs.dedup_order)
        for raw_key, value in txn.items("expiry", prefix):
            mid = U64.unpack(raw_key[8:])[0]
            qs.expires[mid] = U64.unpack(value)[0]
            qs.expiry_heap.append((qs.expires[mid], mid))
        heapq.heapify(qs.expiry_heap)
        if qs.expiry_heap:
            self.expiry_heads.append((qs.expiry_heap[0][0], qid))
        for key, raw in txn.items("messages", prefix):
            mid = U64.unpack(key[8:])[0]
            priority, group = decode_message_head(raw)
            if mid in unacked:
                deadline, slot, since, consumer = unacked[mid]
                past = qs.attempts.get(mid)
                qs.unacked[mid] = Unacked(deadline, slot, group, priority,
                                          past[0] + 1 if past else 1, since, consumer)
                self.deadlines.append((deadline, qid, mid))
                index.inflight_add(slot)
            elif mid in not_before:
                qs.held[mid] = (not_before[mid], group, priority)
                self.holds.append((not_before[mid], qid, mid))
            else:
                index.add(mid, group, priority)
        self.limits.load_rates(qs, [(k[8:], v) for k, v in txn.items("rates", prefix)])
        consumers.load(qs, [(k[8:], v) for k, v in txn.items("consumers", prefix)])
        schedules.load(qs, [(k[8:], v) for k, v in txn.items("schedules", prefix)])
        finish = getattr(index, "finish_load", None)
        if finish is not None:
            finish()
        if index.drain_changes():
            log.warning("queue %r: scheduler records were incomplete on load", qs.defn.name)

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
        layout = entry[5] if len(entry) > 5 and entry[5] is not None else \
            [(len(ops), entry[3] if len(entry) > 3 else 0)]
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
            rules = entry_rules(entry)
            self._track(index)
            live = self._live(entry)
            if live is None:
                ctx = self._begin(txn, now_ms, rules)
                out.append([self._apply_op(ctx, op) for op in ops])
            elif any(live):
                ctx = self._begin(txn, now_ms, rules)
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
            rules = entry_rules(entry)
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
                        results.append(self._apply_op(self._begin(child, now_ms, rules), op))
                        child.put("meta", b"clock", encode_clock(self.last_now_ms, self.last_id))
                except Exception:  # noqa: BLE001 - the bug is contained to this op
                    log.exception("operation %s failed at entry %d; rolled back: %s",
                                  C.name_of(op), index, C.describe(op))
                    self._load(txn)
                    results.append((ResultCode.INTERNAL, "internal error"))
            out.append(results)
            self._begin(txn, now_ms)    # a rolled-back op must not undo the entry's clock
            self._finish(txn, index)
        return out

    def _rollback(self) -> None:
        self.woken.clear()
        self.touched.clear()
        with self.store.read() as txn:
            self._load(txn)

    def _begin(self, txn: LmdbTxn, now_ms: int, rules: int = 1) -> Ctx:
        if now_ms > self.last_now_ms:
            self.last_now_ms = now_ms
        now = self.last_now_ms
        ctx = Ctx(txn, now, now // 1000, rules)
        if self.limit_events and self.limit_events[0][0] <= now * 1000:
            self.limits.due_limits(ctx)              # groups back within their rate, first
        return ctx

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

    def _apply_op(self, ctx: Ctx, op: C.Op) -> Result:
        try:
            code, view = C.decode(op)
        except C.MalformedOp as exc:
            return ResultCode.BAD_COMMAND, str(exc)
        return self._handlers[code](ctx, view)

    def _publish_hints(self) -> None:
        touched, self.touched = self.touched, {}
        for qs in touched.values():
            qs.refresh_hint()

    def _fire_wakeups(self) -> None:
        woken, self.woken = self.woken, set()
        if woken and self.on_ready is not None:
            self.on_ready(woken)

    # Everything outside the state machine reads through these. With raft.apply_in_thread the
    # writer thread changes the state meanwhile: each answer is built from values read once
    # (dict lookups and copies are atomic under the GIL), never from a walk of a structure
    # the writer may be changing.
    def queue_info(self, name: str, now_s: int) -> QueueInfo | None:
        """The queue's definition, counts and rates (None: no such queue here)."""
        qs = self.queues.get(name)
        return None if qs is None else info_of(qs, now_s)

    def queue_infos(self, now_s: int) -> list[QueueInfo]:
        """Every queue's, by name."""
        return sorted((info_of(qs, now_s) for qs in list(self.queues.values())),
                      key=lambda q: q.name)

    def queue_counters(self) -> list[QueueCounters]:
        """Every queue's counts and totals since start (metrics)."""
        return [QueueCounters(qs.defn.name, qs.waiting, len(qs.unacked), qs.stats.totals(),
                              qs.oldest_ms, qs.stats.redelivered, dict(qs.stats.dead_lettered),
                              qs.stats.rejected_full, qs.stats.deduplicated, qs.stats.purged,
                              qs.defn.paused, len(qs.defn.paused_groups),
                              qs.stats.rate_limited, dict(qs.stats.dead_letter_refused),
                              len(qs.consumers), len(qs.schedules), schedules.outcomes(qs))
                for qs in list(self.queues.values())]

    def queue_consumers(self, name: str) -> list[consumers.ConsumerView] | None:
        """The consumers the queue knows, by name (None: no such queue). One entry per
        consumer: run through :attr:`serialize`."""
        qs = self.queues.get(name)
        return None if qs is None else consumers.views(qs)

    def queue_groups(self, name: str) -> list[GroupInfo] | None:
        """The queue's groups by name: those with messages (waiting or delivered) and the
        paused ones, each with its counts and whether a pause covers it (None: no such
        queue). Walks the indexes: run through :attr:`serialize`."""
        qs = self.queues.get(name)
        if qs is None:
            return None
        ready = qs.index.ready_by_group()
        for _, group, _ in qs.held.values():
            ready[group] = ready.get(group, 0) + 1
        unacked: dict[str, int] = {}
        for entry in qs.unacked.values():
            unacked[entry.group] = unacked.get(entry.group, 0) + 1
        paused = frozenset(qs.defn.paused_groups)
        names = sorted(set(ready) | set(unacked) | paused)
        return [GroupInfo(g, ready.get(g, 0), unacked.get(g, 0), paused_match(g, paused))
                for g in names]

    def queue_defs(self) -> dict[int, QueueDef]:
        """Queue id -> definition, of every queue."""
        return {qs.defn.qid: qs.defn for qs in list(self.queues.values())}

    def deliverable_ms(self, name: str) -> int | None | Missing:
        """The unix ms from which the queue has something to deliver (None: nothing, until
        something changes; MISSING: no such queue here)."""
        qs = self.queues.get(name)
        return MISSING if qs is None else qs.deliverable_ms

    def member(self, raft_addr: str) -> MemberInfo | None:
        return self.members.get(raft_addr)

    def member_list(self) -> dict[str, MemberInfo]:
        """Raft address -> member, as published through the log."""
        return dict(self.members)

    def published_leader(self) -> LeaderConfig | None:
        """What the current leader published on its election."""
        return self.leader

    def expiry_due(self, now_ms: int, limit: int) -> list[int]:
        return self.lifecycle.expiry_due(now_ms, limit)

    def next_deadline_ms(self) -> int | None:
        """Earliest ack deadline or end of a hold (nack delay, back-off), for the leader's
        redelivery timer.

        May name an entry that was acked, touched or deleted since: the requeue it triggers
        finds nothing to do and drops the stale head.
        """
        heaps: list[list[tuple[int, int, int]] | list[tuple[int, int]]] = [
            self.deadlines, self.holds, self.expiry_heads]
        heads = []
        for heap in heaps:
            try:
                heads.append(heap[0][0])      # the writer thread may be changing the heap
            except IndexError:
                pass
        return min(heads) if heads else None


    # -- reads the parts answer ----------------------------------------------------------------
    def browse_job(self, name: str, state: str, group: str | None, after: int | None,
                   limit: int, max_bytes: int = 0, now_ms: int | None = None,
                   ) -> BrowseJob | None:
        return self.inspector.browse_job(name, state, group, after, limit, max_bytes, now_ms)

    def explain_job(self, name: str, mid: int, now_ms: int) -> ExplainJob | None:
        return self.inspector.explain_job(name, mid, now_ms)

    def browse(self, name: str, state: str, group: str | None, after: int | None,
               limit: int, max_bytes: int = 0) -> tuple[list[Listed], int | None] | None:
        return self.inspector.browse(name, state, group, after, limit, max_bytes)

    def explain(self, name: str, mid: int, now_ms: int) -> Explained | None:
        return self.inspector.explain(name, mid, now_ms)

    def schedule_views(self, queue: str, name: str = "") -> list[ScheduleView] | None:
        return self.schedules.schedule_views(queue, name)

    def due_schedules(self, now_ms: int) -> list[ScheduleView]:
        return self.schedules.due_schedules(now_ms)

    def next_schedule_ms(self) -> int:
        return self.schedules.next_schedule_ms()

    def scan_schedules(self, now_ms: int, chunk: int,
                       ) -> Iterator[tuple[list[ScheduleView], int]]:
        return self.schedules.scan_schedules(now_ms, chunk)
