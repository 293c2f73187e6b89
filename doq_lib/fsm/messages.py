"""Operations on messages: enqueue, delivery, settling, redelivery (L3)."""
from __future__ import annotations

import functools
import heapq
from typing import Any, Callable

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from doq_lib.fsm import consumers
from doq_lib.fsm.base import MachineState
from doq_lib.fsm.lifecycle import ROUND_BUDGET, ROUND_QUEUES, SWEEP_BUDGET, LifecycleOps, Moves
from doq_lib.fsm.limits import LimitOps
from doq_lib.fsm.state import (
    FAULT_CONTENT,
    OK,
    Ctx,
    DeliveredMessage,
    InjectedFault,
    NackValue,
    QueueState,
    Result,
    StoredMessage,
    Unacked,
)
from doq_lib.models import DEFAULT_GROUP, QueueType
from doq_lib.store import U64, decode_message, dedup_key, encode_message


def _named(ctx: Ctx, items: list[C.Item]) -> frozenset[int]:
    """The ids an operation's items name, which none of its drops takes (rules >= 3)."""
    return frozenset(item.id for item in items if item.id) if ctx.rules >= 3 else frozenset()


class MessageOps:
    def __init__(self, sm: MachineState, lifecycle: LifecycleOps, limits: LimitOps) -> None:
        self.sm = sm
        self.lifecycle = lifecycle
        self.limits = limits

    def enqueue(self, ctx: Ctx, op: C.Enqueue) -> Result:
        name, mid, group, priority = op.queue, op.id, op.group, op.priority
        content, metadata = op.content, op.metadata
        qs = self.sm.use_queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if qs.defn.type is QueueType.DELAYED or not group:
            group = DEFAULT_GROUP
        index = qs.index
        settings = qs.defn.settings
        key = b""
        if settings.dedup_window:
            key = dedup_key(op.dedup_key, mid)
            first = self.lifecycle.duplicate_of(ctx, qs, key)
            if first is not None:                         # seen within the window
                qs.stats.deduplicated += 1
                return OK, StoredMessage(first, group, priority, content, metadata or {}, True)
        if settings.max_messages and (not mid or not qs.contains(mid)) \
                and not self.lifecycle.make_room(ctx, qs):
            return ResultCode.QUEUE_FULL, None
        if not mid:
            mid = self.lifecycle.new_id(qs, ctx.now_ms)
        ctx.txn.put("messages", qs.prefix + U64.pack(mid),
                    encode_message(priority, group, content, metadata))
        if key:
            self.lifecycle.remember_key(ctx, qs, key, mid)
        ttl = op.ttl or settings.message_ttl
        if ttl or mid in qs.expires:
            self.lifecycle.set_expiry(ctx, qs, mid, ctx.now_ms + ttl * 1000 if ttl else 0)
        if index.contains(mid):                      # a duplicate id: overwrite, reposition
            if index.group_of(mid) == group:
                index.reprioritize(mid, priority)
            else:
                index.remove(mid)
                index.add(mid, group, priority)
        elif mid in qs.unacked:                      # stays delivered; new values on return
            entry = qs.unacked[mid]
            entry.group, entry.priority = group, priority
        elif mid in qs.held:                         # stays held; new values on release
            qs.held[mid] = (qs.held[mid][0], group, priority)
        elif op.delay > 0:                           # held back until its time
            until = ctx.now_ms + op.delay * 1000
            self.lifecycle.remember_attempts(ctx, qs, mid, qs.prefix + U64.pack(mid), 0, "", until)
            self.lifecycle.hold(qs, mid, until, group, priority)
            qs.stats.count("enqueue", ctx.now_s)
        else:
            index.add(mid, group, priority)
            qs.stats.count("enqueue", ctx.now_s)
            self.sm.woken.add(name)
        if self.sm.fault_injection and content == FAULT_CONTENT:
            raise InjectedFault("injected fault in enqueue")
        self.sm.flush_sched(ctx, qs)
        return OK, StoredMessage(mid, group, priority, content, metadata or {})

    def dequeue(self, ctx: Ctx, op: C.Dequeue) -> Result:
        name, ack = op.queue, op.ack
        qs = self.sm.use_queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if qs.defn.paused:
            return ResultCode.QUEUE_PAUSED, None
        if qs.unacked and self.limits.at_max_in_flight(qs):
            return ResultCode.QUEUE_EMPTY, None          # blocked until a slot is freed
        index = qs.index
        if qs.expiry_heap and qs.expiry_heap[0][0] <= ctx.now_ms:
            # an expired message is never delivered: those due go first, a bounded number
            # of them per dequeue; past that it delivers nothing until the rest have gone
            # (the leader's rounds take them too)
            budget = SWEEP_BUDGET if ctx.rules >= 2 else 0
            self.lifecycle.sweep_expired(ctx, qs, budget)
            if budget and qs.expiry_heap and qs.expiry_heap[0][0] <= ctx.now_ms:
                self.sm.woken.add(name)
                return ResultCode.QUEUE_EMPTY, None
        mid = index.pop(ctx.now_s, hold=not ack)
        if mid is None:
            return ResultCode.QUEUE_EMPTY, None
        key = qs.prefix + U64.pack(mid)
        raw = ctx.txn.get("messages", key)
        priority, group, content, metadata = decode_message(raw)  # type: ignore[arg-type]
        if qs.defn.settings.group_rate:
            self.limits.rate_take(ctx, qs, group)
        past = qs.attempts.get(mid) if qs.attempts else None
        deliveries, last_error = (past[0] + 1, past[1]) if past else (1, "")
        expires_at = qs.expires.get(mid, 0) if qs.expires else 0
        if ack:
            ctx.txn.delete("messages", key)
            if past:
                self.lifecycle.forget_attempts(ctx, qs, mid, key)
            if expires_at:
                self.lifecycle.set_expiry(ctx, qs, mid, 0)
        else:
            slot = group if qs.defn.type is QueueType.FAIR else DEFAULT_GROUP
            deadline = ctx.now_ms + qs.defn.settings.ack_timeout * 1000
            entry = qs.unacked[mid] = Unacked(deadline, slot, group, priority, deliveries,
                                              ctx.now_ms, op.consumer)
            ctx.txn.put("unacked", key, entry.record())
            heapq.heappush(self.sm.deadlines, (deadline, qs.defn.qid, mid))
        if op.consumer:
            consumers.delivered(ctx, qs, op.consumer, mid, not ack)
        qs.stats.count("dequeue", ctx.now_s)
        self.sm.flush_sched(ctx, qs)
        # the last: when this delivery was made (its token's), None when it was acked at once
        return OK, DeliveredMessage(mid, group, priority, content, metadata, deliveries,
                                    last_error, expires_at, None if ack else ctx.now_ms)

    def enqueue_batch(self, ctx: Ctx, op: C.Items) -> Result:
        items = C.items_of(op)
        for item in items:
            if item.queue not in self.sm.queues:
                return ResultCode.QUEUE_NOT_FOUND, item.queue
        ctx.protected = _named(ctx, items)
        try:
            full = self.lifecycle.batch_overflows(items, ctx.now_ms, self.lifecycle.plan(ctx))
            if full is not None:
                return ResultCode.QUEUE_FULL, full
            values = []
            for item in items:
                code, value = self.enqueue(ctx, item)
                if code != OK and ctx.rules >= 3:    # the check said it fits: a bug, contained
                    raise RuntimeError(f"enqueue batch: {item.queue!r} refused an item the "
                                       f"checks let through ({code})")
                values.append(value)
            return OK, values
        finally:
            ctx.protected = frozenset()

    def enqueue_seq(self, ctx: Ctx, op: C.Items) -> Result:
        values: list[Any] = []
        for item in C.items_of(op):
            code, value = self.enqueue(ctx, item)
            if code != OK:
                return OK, (values, (code, item.queue))
            values.append(value)
        return OK, (values, None)

    def dequeue_many(self, ctx: Ctx, op: C.DequeueMany) -> Result:
        one = C.Dequeue(op.queue, op.ack, op.consumer)
        values: list[Any] = []
        with consumers.batched(ctx, self.sm.queues.get(op.queue) if op.consumer else None):
            for _ in range(max(1, op.max_count)):
                code, value = self.dequeue(ctx, one)
                if code != OK:
                    return (code, None) if not values else (OK, values)
                values.append(value)
        return OK, values

    def ack_many(self, ctx: Ctx, op: C.Ids) -> Result:
        code, failed = self.ack_ids(ctx, op._replace(enqueue=None))
        return code, None if failed is None else [mid for mid, _ in failed]

    def _settle_ids(self, ctx: Ctx, name: str, ids: list[int], tokens: Any,
                    settle: Callable[[int, Any], Result]) -> Result:
        """Settle each of ``ids`` (with its token from ``tokens``: None, or one per id);
        the (id, code) of each that failed."""
        qs = self.sm.use_queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if not isinstance(tokens, list):
            tokens = []
        failed: list[tuple[int, int]] = []
        with consumers.batched(ctx, qs):
            for n, mid in enumerate(ids):
                code = settle(mid, tokens[n] if n < len(tokens) else None)[0]
                if code != OK:
                    if code == ResultCode.NOT_UNACKED and not qs.contains(mid):
                        code = ResultCode.MESSAGE_NOT_FOUND
                    failed.append((mid, int(code)))
        return OK, failed

    def ack_ids(self, ctx: Ctx, op: C.Ids) -> Result:
        name = op.queue
        if op.enqueue is not None:
            return self._ack_ids_and_enqueue(ctx, op)
        return self._settle_ids(ctx, name, op.ids, op.tokens,
                                lambda mid, token: self._ack_one(ctx, name, mid, token))

    def _ack_ids_and_enqueue(self, ctx: Ctx, op: C.Ids) -> Result:
        """ACK_IDS whose ids each store items with their ack (settle-and-enqueue per id):
        ([(id, code, detail), ...] of the ids that failed, [[ids stored], ...] per id)."""
        name = op.queue
        qs = self.sm.use_queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        tokens = op.tokens if isinstance(op.tokens, list) else []
        per_id = op.enqueue if isinstance(op.enqueue, list) else []
        failed: list[tuple[int, int, Any]] = []
        stored: list[list[int]] = []
        with consumers.batched(ctx, qs):
            for n, mid in enumerate(op.ids):
                token = tokens[n] if n < len(tokens) else None
                items = per_id[n] if n < len(per_id) else None
                if items:
                    code, value = self._and_enqueue(ctx, name, mid, token, items, False,
                                                    functools.partial(self._ack_one, ctx, name,
                                                                      mid, token))
                else:
                    code, value = self._ack_one(ctx, name, mid, token)
                    value = (value, [])
                if code != OK:
                    if code == ResultCode.NOT_UNACKED and not qs.contains(mid):
                        code = ResultCode.MESSAGE_NOT_FOUND
                    failed.append((mid, int(code), value))
                    stored.append([])
                else:
                    stored.append(value[1])
        return OK, (failed, stored)

    def nack_ids(self, ctx: Ctx, op: C.NackIds) -> Result:
        name, priority, metadata, error = op.queue, op.priority, op.metadata, op.error
        return self._settle_ids(ctx, name, op.ids, op.tokens, lambda mid, token: self._nack_one(
            ctx, name, mid, priority, metadata, error, op.delay, token))

    def get(self, ctx: Ctx, op: C.MessageRef) -> Result:
        name, mid = op.queue, op.id
        qs = self.sm.use_queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if not qs.contains(mid):
            return ResultCode.MESSAGE_NOT_FOUND, None
        raw = ctx.txn.get("messages", qs.prefix + U64.pack(mid))
        priority, group, content, metadata = decode_message(raw)  # type: ignore[arg-type]
        past = qs.attempts.get(mid, (0, ""))
        entry = qs.unacked.get(mid)
        deliveries = entry.deliveries if entry is not None else past[0]
        return OK, DeliveredMessage(mid, group, priority, content, metadata, deliveries,
                                    past[1], qs.expires.get(mid, 0),
                                    None if entry is None else entry.since)

    def delete(self, ctx: Ctx, op: C.MessageRef) -> Result:
        name, mid = op.queue, op.id
        qs = self.sm.use_queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        key = qs.prefix + U64.pack(mid)
        if qs.index.remove(mid):
            ctx.txn.delete("messages", key)
        elif mid in qs.unacked:
            entry = qs.unacked.pop(mid)
            consumers.lease_ended(ctx, qs, mid, entry)
            ctx.txn.delete("messages", key)
            ctx.txn.delete("unacked", key)
            self.sm.release_slot(qs, entry.slot, ctx)
        elif qs.held.pop(mid, None) is not None:
            ctx.txn.delete("messages", key)
        else:
            return ResultCode.MESSAGE_NOT_FOUND, None
        if mid in qs.attempts:
            self.lifecycle.forget_attempts(ctx, qs, mid, key)
        if mid in qs.expires:
            self.lifecycle.set_expiry(ctx, qs, mid, 0)
        self.sm.flush_sched(ctx, qs)
        return OK, None

    def ack(self, ctx: Ctx, op: C.Settle) -> Result:
        if op.enqueue:
            return self._and_enqueue(ctx, op.queue, op.id, op.token, op.enqueue, False,
                                     lambda: self._ack_one(ctx, op.queue, op.id, op.token))
        return self._ack_one(ctx, op.queue, op.id, op.token)

    def reject_op(self, ctx: Ctx, op: C.RejectMessage) -> Result:
        if op.enqueue:
            return self._and_enqueue(ctx, op.queue, op.id, op.token, op.enqueue, True,
                                     lambda: self.lifecycle.reject(ctx, op))
        return self.lifecycle.reject(ctx, op)

    def _and_enqueue(self, ctx: Ctx, name: str, mid: int, token: Any, raw: Any,
                     dead_letters: bool | None, settle: Callable[[], Result],
                     nack: tuple[int, int] | None = None) -> Result:
        """A settle of delivery ``mid`` and the enqueue of ``raw`` items, all or nothing:
        every check (the delivery, the target queues, their room with the dead letter the
        settle may make counted) comes first; then the settle, then the enqueues. Result:
        (the settle's result, the ids stored, in item order). ``dead_letters``: the settle
        moves the message to its dead-letter queue (a reject); None: when its deliveries are
        spent (a nack)."""
        try:
            items = [C.Item(*i[:9]) for i in raw]
        except TypeError:
            return ResultCode.BAD_COMMAND, "enqueue: malformed items"
        found = self.sm.delivered(name, mid, token)
        if not isinstance(found[0], QueueState):
            return found
        qs, entry = found
        for item in items:
            if item.queue not in self.sm.queues:
                return ResultCode.QUEUE_NOT_FOUND, item.queue
        ctx.protected = _named(ctx, items)
        try:
            plan = self.lifecycle.plan(ctx)
            if dead_letters or (dead_letters is None and self.lifecycle.spent(qs, entry)):
                room = self.lifecycle.dead_letter_room(qs, 1, plan, mid=mid)
                if not room and dead_letters:
                    return ResultCode.QUEUE_FULL, self.lifecycle.full_detail(qs)
                if room and plan.exact:
                    plan.take_out(qs, mid, ready=False)          # to its dead-letter queue
                elif plan.exact:
                    self._back(ctx, qs, mid, entry, nack, plan)  # refused there: given back
            elif dead_letters is False and plan.exact:
                plan.take_out(qs, mid, ready=False)              # acked
            elif plan.exact:
                self._back(ctx, qs, mid, entry, nack, plan)
            full = self.lifecycle.batch_overflows(items, ctx.now_ms, plan)
            if full is not None:
                return ResultCode.QUEUE_FULL, self.lifecycle.full_detail(self.sm.queues[full],
                                                                         own=True)
            code, value = settle()
            if code != OK:
                return code, value
            ids = []
            for item in items:
                stored, out = self.enqueue(ctx, item)
                if stored != OK:       # the checks above said it fits: contained as a bug
                    raise RuntimeError(f"settle-and-enqueue: {item.queue!r} refused an item "
                                       f"the checks let through ({stored})")
                ids.append(out[0])
            return OK, (value, ids)
        finally:
            ctx.protected = frozenset()

    def _back(self, ctx: Ctx, qs: QueueState, mid: int, entry: Unacked,
              nack: tuple[int, int] | None, plan: Moves) -> None:
        """(a dry run) A nacked message going back: ready at once (a drop_oldest may take
        it then) or held back."""
        if nack is None:
            return
        priority, delay = nack
        until = delay or (0 if priority else
                          self.lifecycle.backoff_until(ctx, qs, mid, entry.deliveries))
        if not until and mid not in plan.protected:
            plan.count(plan.free, qs.defn.name)

    def _ack_one(self, ctx: Ctx, name: str, mid: int, token: Any = None) -> Result:
        taken = self.sm.pop_delivered(ctx, name, mid, token)
        if len(taken) == 2:
            return taken                                # not delivered: the failure
        qs, entry, key = taken
        consumers.settled(ctx, qs, mid, entry, acked=True)
        ctx.txn.delete("messages", key)
        if entry.deliveries > 1:
            self.lifecycle.forget_attempts(ctx, qs, mid, key)
        if mid in qs.expires:
            self.lifecycle.set_expiry(ctx, qs, mid, 0)
        self.sm.release_slot(qs, entry.slot, ctx)
        qs.stats.count("ack", ctx.now_s)
        self.sm.flush_sched(ctx, qs)
        return OK, None

    def nack(self, ctx: Ctx, op: C.Nack) -> Result:
        if op.enqueue:
            return self._and_enqueue(ctx, op.queue, op.id, op.token, op.enqueue, None,
                                     lambda: self._nack_one(ctx, op.queue, op.id, op.priority,
                                                            op.metadata, op.error, op.delay,
                                                            op.token), (op.priority, op.delay))
        return self._nack_one(ctx, op.queue, op.id, op.priority, op.metadata, op.error, op.delay,
                              op.token)

    def _nack_one(self, ctx: Ctx, name: str, mid: int, priority: int,
                  metadata: dict[str, str] | None, error: str = "", delay: int = 0,
                  token: Any = None) -> Result:
        taken = self.sm.pop_delivered(ctx, name, mid, token)
        if len(taken) == 2:
            return taken                                # not delivered: the failure
        qs, entry, key = taken
        consumers.settled(ctx, qs, mid, entry, acked=False)
        qs.stats.count("nack", ctx.now_s)
        refused = ""
        if self.lifecycle.spent(qs, entry):
            if self.lifecycle.dead_letter_room(qs, 1):
                self.sm.release_slot(qs, entry.slot, ctx)
                self.lifecycle.dead_letter(ctx, qs, mid, key, "max_deliveries", entry.deliveries,
                                  error, metadata)
                self.sm.flush_sched(ctx, qs)
                return OK, NackValue(entry.priority, metadata, True)
            # its dead-letter queue is full and refuses more: it stays here, given back
            refused = self.lifecycle.full_detail(qs)
            counts = qs.stats.dead_letter_refused
            counts["max_deliveries"] = counts.get("max_deliveries", 0) + 1
        if delay > 0:
            until = ctx.now_ms + delay * 1000
        else:                                 # a nack that names a priority: back at once
            until = 0 if priority else self.lifecycle.backoff_until(ctx, qs, mid, entry.deliveries)
        self.lifecycle.remember_attempts(ctx, qs, mid, key, entry.deliveries, error, until)
        new_priority = priority or entry.priority
        if new_priority != entry.priority or metadata is not None:
            raw = ctx.txn.get("messages", key)
            _, group, content, old_meta = decode_message(raw)  # type: ignore[arg-type]
            meta = old_meta if metadata is None else metadata
            ctx.txn.put("messages", key, encode_message(new_priority, group, content, meta))
        if until:
            self.lifecycle.hold(qs, mid, until, entry.group, new_priority)
            self.sm.release_slot(qs, entry.slot, ctx)
        else:
            qs.index.add(mid, entry.group, new_priority)
            qs.index.inflight_remove(entry.slot)
            self.sm.woken.add(name)
        self.lifecycle.recheck_expiry(qs, mid)
        self.sm.flush_sched(ctx, qs)
        return OK, NackValue(new_priority, metadata, False, refused)

    def touch(self, ctx: Ctx, op: C.Settle) -> Result:
        found = self.sm.delivered(op.queue, op.id, op.token)
        if not isinstance(found[0], QueueState):
            return found
        qs, entry = found
        entry.deadline = ctx.now_ms + qs.defn.settings.ack_timeout * 1000
        ctx.txn.put("unacked", qs.prefix + U64.pack(op.id), entry.record())
        heapq.heappush(self.sm.deadlines, (entry.deadline, qs.defn.qid, op.id))
        return OK, None

    def update_priority(self, ctx: Ctx, op: C.UpdatePriority) -> Result:
        name, mid, priority = op.queue, op.id, op.priority
        qs = self.sm.use_queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if qs.index.contains(mid):
            qs.index.reprioritize(mid, priority)
        elif mid in qs.unacked:
            qs.unacked[mid].priority = priority
        elif mid in qs.held:
            qs.held[mid] = (*qs.held[mid][:2], priority)
        else:
            return ResultCode.MESSAGE_NOT_FOUND, None
        key = qs.prefix + U64.pack(mid)
        _, group, content, metadata = decode_message(ctx.txn.get("messages", key))  # type: ignore[arg-type]
        ctx.txn.put("messages", key, encode_message(priority, group, content, metadata))
        self.sm.flush_sched(ctx, qs)
        return OK, None

    def requeue_expired(self, ctx: Ctx, op: C.Round) -> Result:
        """The leader's round: what is due at the entry's time — deliveries whose lease ran
        out, held messages whose hold ended, TTL expiry, idle consumers. A bounded round
        (``budget``) handles at most that many messages, in the order they came due, looks
        at the TTL expiry of the queues in ``expiring`` and at the idle consumers of those
        in ``forget`` (the leader names them: at most ROUND_QUEUES each); what is left waits
        for the next round. The first form (no budget) handles everything, in every queue.
        Answers how many messages it moved."""
        if not op.budget:
            return self._requeue_everything(ctx)
        budget = min(op.budget, ROUND_BUDGET) if isinstance(op.budget, int) else ROUND_BUDGET
        touched: dict[str, QueueState] = {}
        count = self._requeue_due(ctx, touched, budget)
        if count < budget:
            count += self.lifecycle.release_holds(ctx, touched, budget - count)
        for qs in self._named(op.expiring):
            left = budget - count
            if left <= 0:
                break
            if qs.expiry_heap and qs.expiry_heap[0][0] <= ctx.now_ms:
                count += self.lifecycle.sweep_expired(ctx, qs, left)[1]
        for qs in self._named(op.forget):
            if qs.consumers:
                consumers.forget(ctx, qs)                # the idle ones, a few at a time
                self.sm.touched[qs.defn.name] = qs
        for name, qs in touched.items():
            self.sm.flush_sched(ctx, qs)
            self.sm.woken.add(name)
        return OK, count

    def _named(self, qids: Any) -> list[QueueState]:
        """The queues of a round's list of qids (any that is no longer there left out)."""
        if not isinstance(qids, list):
            return []
        by_qid = self.sm.by_qid
        found = [by_qid.get(qid) for qid in qids[:ROUND_QUEUES] if isinstance(qid, int)]
        return [qs for qs in found if qs is not None]

    def _requeue_due(self, ctx: Ctx, touched: dict[str, QueueState], budget: int = 0) -> int:
        """Deliveries whose lease ran out go back (or to their dead-letter queue), at most
        ``budget`` of them (0: all); how many. Stale heap entries (acked, touched, deleted
        since) are dropped on the way and do not count: every replica has the same live
        ones in the same order, whatever stale ones it still holds."""
        heap, count = self.sm.deadlines, 0
        while heap and heap[0][0] <= ctx.now_ms and (not budget or count < budget):
            deadline, qid, mid = heapq.heappop(heap)
            qs = self.sm.by_qid.get(qid)
            if qs is None:
                continue                                      # the queue was deleted
            entry = qs.unacked.get(mid)
            if entry is None or entry.deadline != deadline:
                continue                                      # acked, touched or deleted
            del qs.unacked[mid]
            consumers.lease_ended(ctx, qs, mid, entry)
            key = qs.prefix + U64.pack(mid)
            ctx.txn.delete("unacked", key)
            if self.lifecycle.spent(qs, entry) and not self.lifecycle.dead_letter_room(qs, 1):
                counts = qs.stats.dead_letter_refused     # stays here: its dead-letter
                counts["max_deliveries"] = counts.get("max_deliveries", 0) + 1  # queue is full
            elif self.lifecycle.spent(qs, entry):
                self.sm.release_slot(qs, entry.slot, ctx)
                self.lifecycle.dead_letter(ctx, qs, mid, key, "max_deliveries",
                                           entry.deliveries, "")
                touched[qs.defn.name] = qs
                self.sm.touched[qs.defn.name] = qs
                count += 1
                continue
            until = self.lifecycle.backoff_until(ctx, qs, mid, entry.deliveries)
            self.lifecycle.remember_attempts(ctx, qs, mid, key, entry.deliveries, "", until)
            if until:
                self.lifecycle.hold(qs, mid, until, entry.group, entry.priority)
                self.sm.release_slot(qs, entry.slot, ctx)
            else:
                qs.index.add(mid, entry.group, entry.priority)
                qs.index.inflight_remove(entry.slot)
            self.lifecycle.recheck_expiry(qs, mid)
            qs.stats.redelivered += 1
            touched[qs.defn.name] = qs
            self.sm.touched[qs.defn.name] = qs
            count += 1
        return count

    def _requeue_everything(self, ctx: Ctx) -> Result:
        """REQUEUE_EXPIRED's first form, as entries written before bounded rounds apply."""
        touched: dict[str, QueueState] = {}
        count = self._requeue_due(ctx, touched)
        count += self.lifecycle.release_holds(ctx, touched)
        for qs in list(self.sm.queues.values()):
            if qs.expiry_heap and qs.expiry_heap[0][0] <= ctx.now_ms:
                count += self.lifecycle.sweep_expired(ctx, qs)[0]
            if qs.consumers:
                consumers.forget(ctx, qs)                # the idle ones, a few at a time
                touched[qs.defn.name] = qs
                self.sm.touched[qs.defn.name] = qs
        for name, qs in touched.items():
            self.sm.flush_sched(ctx, qs)
            self.sm.woken.add(name)
        return OK, count
