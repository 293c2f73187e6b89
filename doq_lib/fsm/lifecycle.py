"""The message lifecycle (L3): delivery counts, dead letters, reject, redrive.

A message that is delivered and given back (nack, ack timeout) keeps how often it was
delivered and the last error it was given in an ``attempts`` record; a message that was
never given back has none, so the fast path writes nothing more. When a message comes back
on its queue's last allowed delivery (``max_deliveries``) it moves to the queue's dead-letter
queue in the same operation, or is dropped (counted) without one.
"""
from __future__ import annotations

import heapq
import struct
import zlib

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from doq_lib.fsm import consumers
from doq_lib.fsm.base import MachineState
from doq_lib.fsm.state import OK, Ctx, QueueState, Result, Unacked
from doq_lib.ids import next_fsm_id
from doq_lib.models import DEFAULT_GROUP, REJECT_REASONS, QueueType
from doq_lib.store import (
    U64,
    decode_message,
    dedup_key,
    encode_attempts,
    encode_dedup,
    encode_message,
)

DEDUP_PRUNE = 256              # expired dedup keys forgotten per enqueue, at most
# Bounds of the loops over due work one operation runs (entries of commands.RULES >= 2):
SWEEP_BUDGET = 256             # expired messages a dequeue dead-letters before it delivers
ROUND_BUDGET = 1000            # messages one leader's round (REQUEUE_EXPIRED) handles
ROUND_QUEUES = 64              # queues a round names for TTL expiry, and for idle consumers
MAX_DEAD_LETTER_HOPS = 16      # dead-letter queues making room for each other, at most
DEAD_LETTER_RETRY_MS = 60_000  # an expired message its full dead-letter queue refused waits
_JITTER = struct.Struct(">QI")


class Moves:
    """A dry run of one operation's moves: what the checks before it (``_room``,
    ``batch_overflows``) have counted on so far, so that the moves that follow never meet a
    refusal the checks said would not come, and no check refuses what the moves would fit.

    Per queue: messages placed (and how many of them a drop_oldest may take: ready and not
    named by the operation), dropped to make room, taken out (settled, moved); the (queue,
    id) it adds and takes out, and the dedup keys it stores. ``protected``: the ids the
    operation names, which none of its drops takes (an item that names an id replaces that
    message, whatever else the operation does first). ``exact`` False: the count of entries
    written before these rules (commands' RULES < 3), as they applied then."""

    __slots__ = ("exact", "protected", "placed", "free", "dropped", "gone", "added", "removed",
                 "keys")

    def __init__(self, protected: frozenset[int] = frozenset(), exact: bool = True) -> None:
        self.exact, self.protected = exact, protected
        self.placed: dict[str, int] = {}
        self.free: dict[str, int] = {}          # change in what a drop_oldest may take
        self.dropped: dict[str, int] = {}
        self.gone: dict[str, int] = {}
        self.added: set[tuple[str, int]] = set()
        self.removed: set[tuple[str, int]] = set()
        self.keys: set[tuple[str, bytes]] = set()

    @staticmethod
    def count(counts: dict[str, int], name: str, n: int = 1) -> None:
        counts[name] = counts.get(name, 0) + n

    def contains(self, qs: QueueState, mid: int) -> bool:
        """Whether ``mid`` is in ``qs`` at this point of the operation."""
        name = qs.defn.name
        return (name, mid) in self.added or qs.contains(mid) and (name, mid) not in self.removed

    def held(self, qs: QueueState) -> int:
        """The messages ``qs`` holds at this point (waiting and delivered)."""
        name = qs.defn.name
        return (qs.waiting + len(qs.unacked) + self.placed.get(name, 0) -
                self.dropped.get(name, 0) - (self.gone.get(name, 0) if self.exact else 0))

    def droppable(self, qs: QueueState) -> int:
        """What a drop_oldest of ``qs`` may take at this point: its waiting (ready) messages
        that the operation does not name."""
        name = qs.defn.name
        ready = qs.index.ready - self.dropped.get(name, 0)
        if not self.exact:
            return ready
        named = sum(1 for mid in self.protected if qs.index.contains(mid))
        return ready - named + self.free.get(name, 0)

    def take_out(self, qs: QueueState, mid: int, ready: bool) -> None:
        """The operation takes ``mid`` out of ``qs`` (a settle, a move)."""
        name = qs.defn.name
        self.count(self.gone, name)
        self.removed.add((name, mid))
        self.added.discard((name, mid))
        if ready and mid not in self.protected:
            self.count(self.free, name, -1)


class LifecycleOps:
    def __init__(self, sm: MachineState) -> None:
        self.sm = sm

    def new_id(self, qs: QueueState, now_ms: int) -> int:
        mid = next_fsm_id(self.sm.last_id, now_ms)
        while qs.contains(mid):
            mid = next_fsm_id(mid, now_ms)
        self.sm.last_id = mid
        return mid

    def reject(self, ctx: Ctx, op: C.RejectMessage) -> Result:
        """Dead-letter a delivered message now (reason ``op.reason``: rejected,
        retries_spent or unreadable); refused, with the message left delivered, when its
        dead-letter queue is full and refuses more."""
        found = self.sm.delivered(op.queue, op.id, op.token)
        if not isinstance(found[0], QueueState):
            return found                                # not delivered: the failure
        qs = found[0]
        if not self.dead_letter_room(qs, 1):
            return ResultCode.QUEUE_FULL, self.full_detail(qs)
        taken = self.sm.pop_delivered(ctx, op.queue, op.id)
        if len(taken) == 2:
            return taken                                # not delivered: the failure
        qs, entry, key = taken
        consumers.settled(ctx, qs, op.id, entry, acked=False)
        self.sm.release_slot(qs, entry.slot, ctx)
        reason = op.reason if op.reason in REJECT_REASONS else "rejected"
        self.dead_letter(ctx, qs, op.id, key, reason, entry.deliveries, op.error)
        self.sm.flush_sched(ctx, qs)
        return OK, None

    def redrive(self, ctx: Ctx, op: C.Redrive) -> Result:
        """Move waiting messages of ``op.queue`` (a dead-letter queue) back to ``op.to`` or each
        to its ``x-dead-from``, without their ``x-dead-*`` metadata and with no deliveries."""
        qs = self.sm.use_queue(op.queue)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if op.to and op.to not in self.sm.queues:
            return ResultCode.QUEUE_NOT_FOUND, op.to
        ids: list[int] = []
        if op.ids is None:
            for key, _ in ctx.txn.items("messages", qs.prefix):
                if len(ids) >= op.limit:
                    break
                mid = U64.unpack_from(key, 8)[0]
                if mid not in qs.unacked:
                    ids.append(mid)
        else:
            ids = list(dict.fromkeys(op.ids))
        moved, failed = 0, []
        for mid in ids:
            code, detail = self._redrive_one(ctx, qs, mid, op.to)
            if code == OK:
                moved += 1
            else:
                failed.append((mid, int(code), detail))
        self.sm.flush_sched(ctx, qs)
        return OK, (moved, failed)

    def _redrive_one(self, ctx: Ctx, qs: QueueState, mid: int, to: str) -> tuple[int, str]:
        if mid in qs.unacked:
            return ResultCode.MESSAGE_DELIVERED, "the message is delivered and not acknowledged"
        if not qs.index.contains(mid) and mid not in qs.held:
            return ResultCode.MESSAGE_NOT_FOUND, f"no message {mid} in queue {qs.defn.name!r}"
        key = qs.prefix + U64.pack(mid)
        raw = ctx.txn.get("messages", key)
        priority, group, content, metadata = decode_message(raw)  # type: ignore[arg-type]
        name = to or metadata.get("x-dead-from", "")
        if not name:
            return ResultCode.NO_ORIGIN, "no x-dead-from: name the queue to move it to ('to')"
        target = self.sm.use_queue(name)
        if target is None:
            return ResultCode.QUEUE_NOT_FOUND, f"queue {name!r} does not exist"
        if target is qs:
            return ResultCode.INVALID_LIFECYCLE, "the message is in that queue already"
        if not to and target.defn.settings.dead_letter_queue != qs.defn.name:
            # x-dead-from is only metadata: trusted only when it names a queue that does
            # send its dead letters here (so a message cannot steer a redrive elsewhere)
            return ResultCode.NO_ORIGIN, (
                f"x-dead-from names queue {name!r}, which does not dead-letter into "
                f"{qs.defn.name!r}: name the queue to move it to ('to')")
        plan = self.plan(ctx)
        if plan.exact:                     # it leaves first: its room here is free then
            plan.take_out(qs, mid, ready=qs.index.contains(mid))
        if not self._room(target, 1, plan):
            return ResultCode.QUEUE_FULL, self.full_detail(target, own=True)
        if qs.held.pop(mid, None) is None:
            qs.index.remove(mid)
        ctx.txn.delete("messages", key)
        self.forget_attempts(ctx, qs, mid, key)
        if mid in qs.expires:
            self.set_expiry(ctx, qs, mid, 0)
        meta = {k: v for k, v in metadata.items()
                if not k.startswith("x-dead-") and k not in ("x-deliveries", "x-last-error")}
        self._place(ctx, target, mid, group, priority, content, meta)
        return OK, ""

    def _place(self, ctx: Ctx, target: QueueState, mid: int, group: str, priority: int,
               content: str, metadata: dict[str, str]) -> None:
        """Store a moved message (dead letter, redrive) in ``target`` as a new waiting one:
        its id kept when free there, the default group in a delayed queue."""
        if target.defn.type is QueueType.DELAYED or not group:
            group = DEFAULT_GROUP
        if target.defn.settings.max_messages:
            self.make_room(ctx, target)          # room was checked (_room) before anything
        new_id = mid if not target.contains(mid) else self.new_id(target, ctx.now_ms)
        ctx.txn.put("messages", target.prefix + U64.pack(new_id),
                    encode_message(priority, group, content, metadata))
        target.index.add(new_id, group, priority)
        target.stats.count("enqueue", ctx.now_s)
        self.sm.woken.add(target.defn.name)
        self.sm.flush_sched(ctx, target)

    # -- max_messages and overflow -----------------------------------------------------------
    def make_room(self, ctx: Ctx, qs: QueueState) -> bool:
        """Whether one more message fits in ``qs`` (which has a max_messages): with overflow
        ``drop_oldest`` the oldest waiting messages are dead-lettered (reason ``overflow``)
        until it does; with ``reject``, nothing waiting to drop, or a dead-letter queue that
        cannot take them (its own overflow rule), it does not fit and nothing changes."""
        index = qs.index
        over = qs.waiting + len(qs.unacked) + 1 - qs.defn.settings.max_messages
        if over <= 0:
            return True
        if not self._room(qs, 1, self.plan(ctx)):
            qs.stats.rejected_full += 1                   # refused: nothing changes
            return False
        for _ in range(over):
            oldest = index.oldest_id(ctx.protected)
            assert oldest is not None
            index.remove(oldest)
            key = qs.prefix + U64.pack(oldest)
            self.dead_letter(ctx, qs, oldest, key, "overflow",
                              qs.attempts.get(oldest, (0, ""))[0], "")
        return True

    @staticmethod
    def plan(ctx: Ctx) -> Moves:
        """A new dry run for an operation of ``ctx`` (its rules, the ids it names)."""
        return Moves(ctx.protected, exact=ctx.rules >= 3)

    def _room(self, qs: QueueState, count: int, plan: Moves | None = None, depth: int = 0,
              ready: int | None = None) -> bool:
        """Whether ``count`` more messages (``ready`` of them waiting ones a drop_oldest may
        take; default all) can be placed in ``qs`` now under its max_messages and overflow
        rule: with ``drop_oldest`` its oldest waiting messages make room, if its own
        dead-letter queue can take them (and so on down the chain, at most
        MAX_DEAD_LETTER_HOPS deep). ``plan`` carries what earlier checks of the same
        operation counted on, and is updated. Nothing changes here."""
        limit = qs.defn.settings.max_messages
        if not limit:
            return True
        plan = Moves() if plan is None else plan
        name = qs.defn.name
        need = max(0, plan.held(qs) + count - limit)
        if need:
            if (qs.defn.settings.overflow != "drop_oldest" or depth >= MAX_DEAD_LETTER_HOPS
                    or need > plan.droppable(qs)
                    or not self.dead_letter_room(qs, need, plan, depth + 1)):
                return False
            plan.count(plan.dropped, name, need)
        plan.count(plan.placed, name, count)
        plan.count(plan.free, name, count if ready is None else ready)
        return True

    def dead_letter_room(self, qs: QueueState, count: int, plan: Moves | None = None,
                          depth: int = 0, mid: int = 0) -> bool:
        """Whether ``count`` messages of ``qs`` can be dead-lettered now: dropped (no
        dead-letter queue) or placed in its dead-letter queue (see ``_room``). ``mid``: the
        one message's id when it is known (it keeps it there when free)."""
        name = qs.defn.settings.dead_letter_queue
        target = self.sm.use_queue(name) if name else None
        if target is None:
            return True
        plan = Moves() if plan is None else plan
        kept = bool(mid) and plan.exact and not plan.contains(target, mid)
        if not self._room(target, count, plan, depth,
                          ready=0 if kept and mid in plan.protected else count):
            return False
        if kept:
            plan.added.add((name, mid))
        return True

    def full_detail(self, qs: QueueState, own: bool = False) -> str:
        """Why a message cannot go to ``qs`` (``own``) or to its dead-letter queue."""
        target = qs if own else self.sm.use_queue(qs.defn.settings.dead_letter_queue)
        assert target is not None
        settings = target.defn.settings
        return (f"{'queue' if own else 'dead-letter queue'} {target.defn.name!r} is full "
                f"(max_messages {settings.max_messages}, overflow {settings.overflow})")

    def batch_overflows(self, items: list[C.Item], now_ms: int,
                         plan: Moves) -> str | None:
        """The first queue that cannot take its new messages of an all-or-nothing batch
        (checked before anything is applied, in item order, the dead-letter queues that
        make room included), or None. ``plan``: what the operation counted on already."""
        for item in items:
            qs = self.sm.queues[item.queue]
            name = qs.defn.name
            key = dedup_key(item.dedup_key, item.id) if qs.defn.settings.dedup_window else b""
            if key and ((name, key) in plan.keys or self._seen(qs, key, now_ms)):
                continue                              # a duplicate: nothing stored
            if not plan.exact and not qs.defn.settings.max_messages:
                continue
            if key and plan.exact:
                plan.keys.add((name, key))
            if item.id and plan.contains(qs, item.id):
                continue                              # replaces a message: no room needed
            if item.id:
                plan.added.add((name, item.id))
            if not self._room(qs, 1, plan, ready=0 if item.id or item.delay > 0 else 1):
                qs.stats.rejected_full += 1
                return qs.defn.name
        return None

    # -- message TTL ---------------------------------------------------------------------------
    def set_expiry(self, ctx: Ctx, qs: QueueState, mid: int, expires_at: int) -> None:
        """Message ``mid`` is never delivered after ``expires_at`` (unix ms; 0: no expiry)."""
        key = qs.prefix + U64.pack(mid)
        if expires_at:
            qs.expires[mid] = expires_at
            self._push_expiry(qs, expires_at, mid)
            ctx.txn.put("expiry", key, U64.pack(expires_at))
        elif qs.expires.pop(mid, None) is not None:
            ctx.txn.delete("expiry", key)

    def recheck_expiry(self, qs: QueueState, mid: int) -> None:
        """A message back among the waiting ones: its expiry is looked at again (the sweep
        skipped it while it was delivered)."""
        expires_at = qs.expires.get(mid)
        if expires_at:
            self._push_expiry(qs, expires_at, mid)

    def _push_expiry(self, qs: QueueState, expires_at: int, mid: int) -> None:
        heap = qs.expiry_heap
        heapq.heappush(heap, (expires_at, mid))
        if heap[0][1] == mid:                    # the queue's first expiry is now this one
            heapq.heappush(self.sm.expiry_heads, (expires_at, qs.defn.qid))

    def sweep_expired(self, ctx: Ctx, qs: QueueState, budget: int = 0) -> tuple[int, int]:
        """Dead-letter (reason ``expired``) the waiting messages of ``qs`` whose time has
        passed, at most ``budget`` of them (0: every one); a delivered one is left to its
        consumer (looked at again if it comes back). Answers (dead-lettered, messages
        handled: dead-lettered or kept back for their full dead-letter queue)."""
        heap, count, handled = qs.expiry_heap, 0, 0
        while heap and heap[0][0] <= ctx.now_ms and (not budget or handled < budget):
            expires_at, mid = heapq.heappop(heap)
            if qs.expires.get(mid) != expires_at:
                continue                                  # acked, deleted or replaced
            if qs.index.contains(mid):
                group, held_until = qs.index.group_of(mid), 0
                priority = qs.index.priority_of(mid) or 0
            elif mid in qs.held:
                held_until, group, priority = qs.held[mid]
            else:
                continue                                  # delivered now
            key = qs.prefix + U64.pack(mid)
            handled += 1
            if not self.dead_letter_room(qs, 1):
                # its dead-letter queue is full and refuses more: it stays here, held back
                # (never delivered), and is tried again when the hold ends
                if not held_until:
                    qs.index.remove(mid)
                    self._refused_dead_letter(ctx, qs, mid, key, "expired", group, priority)
                continue
            if held_until:
                del qs.held[mid]
            else:
                qs.index.remove(mid)
            self.set_expiry(ctx, qs, mid, 0)
            self.dead_letter(ctx, qs, mid, key, "expired", qs.attempts.get(mid, (0, ""))[0], "")
            count += 1
        if heap:                                 # its first expiry from here on
            heapq.heappush(self.sm.expiry_heads, (heap[0][0], qs.defn.qid))
        self.sm.flush_sched(ctx, qs)
        return count, handled

    def expiry_due(self, now_ms: int, limit: int) -> list[int]:
        """(this node's index, not replicated state) Up to ``limit`` qids of queues whose
        first TTL expiry has come, earliest first. ``expiry_heads`` holds the first expiry
        of every queue that has one, and older firsts since replaced: those due are dropped
        here, a bounded number per call."""
        heads, queues = self.sm.expiry_heads, self.sm.by_qid
        found: list[tuple[int, int]] = []
        for _ in range(16 * limit):
            if not heads or heads[0][0] > now_ms or len(found) >= limit:
                break
            at, qid = heapq.heappop(heads)
            qs = queues.get(qid)
            if qs is not None and qs.expiry_heap and qs.expiry_heap[0][0] == at and \
                    (at, qid) not in found:
                found.append((at, qid))
        for entry in found:                      # still first until a sweep moves it on
            heapq.heappush(heads, entry)
        return [qid for _, qid in found]

    # -- the dedup window ----------------------------------------------------------------------
    @staticmethod
    def _seen(qs: QueueState, key: bytes, now_ms: int) -> int | None:
        """The first id stored under ``key`` within the queue's dedup window, or None."""
        first = qs.dedup.get(key)
        if first is None or first[1] <= now_ms - qs.defn.settings.dedup_window * 1000:
            return None
        return first[0]

    def duplicate_of(self, ctx: Ctx, qs: QueueState, key: bytes) -> int | None:
        """Forget keys whose window has passed (a bounded number per call, oldest first by
        (time, key): what is left is still judged by its time), then: the first id under
        ``key`` within the window."""
        cutoff = ctx.now_ms - qs.defn.settings.dedup_window * 1000
        order = qs.dedup_order
        for _ in range(DEDUP_PRUNE):
            if not order or order[0][0] > cutoff:
                break
            seen_ms, old = heapq.heappop(order)
            if qs.dedup.get(old, (0, -1))[1] == seen_ms:
                del qs.dedup[old]
                ctx.txn.delete("dedup", qs.prefix + old)
        return self._seen(qs, key, ctx.now_ms) if key else None

    @staticmethod
    def remember_key(ctx: Ctx, qs: QueueState, key: bytes, mid: int) -> None:
        qs.dedup[key] = (mid, ctx.now_ms)
        heapq.heappush(qs.dedup_order, (ctx.now_ms, key))
        ctx.txn.put("dedup", qs.prefix + key, encode_dedup(mid, ctx.now_ms))

    @staticmethod
    def spent(qs: QueueState, entry: Unacked) -> bool:
        """Whether a message coming back has used up the queue's deliveries."""
        limit = qs.defn.settings.max_deliveries
        return bool(limit) and entry.deliveries >= limit

    @staticmethod
    def remember_attempts(ctx: Ctx, qs: QueueState, mid: int, key: bytes, deliveries: int,
                           error: str, not_before: int = 0) -> None:
        """A delivered message given back: keep how often it was delivered, its last error
        (an empty one keeps the error it had) and until when it is held back (0: not)."""
        if not error:
            error = qs.attempts.get(mid, (0, ""))[1]
        qs.attempts[mid] = (deliveries, error)
        ctx.txn.put("attempts", key, encode_attempts(deliveries, error, not_before))

    # -- holds: nack delays and back-off ------------------------------------------------------
    @staticmethod
    def backoff_until(ctx: Ctx, qs: QueueState, mid: int, deliveries: int) -> int:
        """When a message given back after ``deliveries`` deliveries may be delivered again
        under the queue's back-off (0: at once): min(backoff_max, backoff_initial x
        2^(deliveries-1)) seconds, plus up to 20 % jitter drawn from the id and the delivery
        count, so that every replica computes the same."""
        settings = qs.defn.settings
        if not settings.backoff_initial:
            return 0
        base = min(settings.backoff_max,
                   settings.backoff_initial << min(max(deliveries - 1, 0), 40))
        jitter = zlib.crc32(_JITTER.pack(mid, deliveries)) / 2 ** 32 * 0.2
        return ctx.now_ms + int(base * 1000 * (1 + jitter))

    def hold(self, qs: QueueState, mid: int, until: int, group: str, priority: int) -> None:
        qs.held[mid] = (until, group, priority)
        heapq.heappush(self.sm.holds, (until, qs.defn.qid, mid))

    def release_holds(self, ctx: Ctx, touched: dict[str, QueueState], budget: int = 0) -> int:
        """Put the held messages whose time has come back in their queue's index, at most
        ``budget`` of them (0: every one); how many."""
        heap, count = self.sm.holds, 0
        while heap and heap[0][0] <= ctx.now_ms and (not budget or count < budget):
            until, qid, mid = heapq.heappop(heap)
            qs = self.sm.by_qid.get(qid)
            held = qs.held.get(mid) if qs is not None else None
            if qs is None or held is None or held[0] != until:
                continue                          # deleted, or held again since
            del qs.held[mid]
            deliveries, error = qs.attempts.get(mid, (0, ""))
            if deliveries or error:
                ctx.txn.put("attempts", qs.prefix + U64.pack(mid),
                            encode_attempts(deliveries, error))
            else:                        # an enqueue's delay: nothing left to remember
                self.forget_attempts(ctx, qs, mid, qs.prefix + U64.pack(mid))
            qs.index.add(mid, held[1], held[2])
            self.recheck_expiry(qs, mid)
            touched[qs.defn.name] = qs
            self.sm.touched[qs.defn.name] = qs
            count += 1
        return count

    def _refused_dead_letter(self, ctx: Ctx, qs: QueueState, mid: int, key: bytes,
                             reason: str, group: str, priority: int) -> None:
        """A message out of ``qs``'s index that its full dead-letter queue refused: held
        back (not delivered) for DEAD_LETTER_RETRY_MS, then looked at again; counted."""
        refused = qs.stats.dead_letter_refused
        refused[reason] = refused.get(reason, 0) + 1
        until = ctx.now_ms + DEAD_LETTER_RETRY_MS
        deliveries, error = qs.attempts.get(mid, (0, ""))
        qs.attempts[mid] = (deliveries, error)
        ctx.txn.put("attempts", key, encode_attempts(deliveries, error, until))
        self.hold(qs, mid, until, group, priority)

    @staticmethod
    def forget_attempts(ctx: Ctx, qs: QueueState, mid: int, key: bytes) -> None:
        if qs.attempts.pop(mid, None) is not None:
            ctx.txn.delete("attempts", key)

    def dead_letter(self, ctx: Ctx, qs: QueueState, mid: int, key: bytes, reason: str,
                     deliveries: int, error: str,
                     metadata: dict[str, str] | None = None) -> None:
        """Move message ``mid`` (already out of ``qs``'s index and unacked set) to the
        queue's dead-letter queue, with ``x-dead-*`` metadata, in this same operation; with
        no dead-letter queue it is dropped. Counted by reason either way. The caller has
        checked that the dead-letter queue takes it (``_dead_letter_room``)."""
        raw = ctx.txn.get("messages", key)
        priority, group, content, old_meta = decode_message(raw)  # type: ignore[arg-type]
        if not error:
            error = qs.attempts.get(mid, (0, ""))[1]
        ctx.txn.delete("messages", key)
        self.forget_attempts(ctx, qs, mid, key)
        if mid in qs.expires:
            self.set_expiry(ctx, qs, mid, 0)
        counts = qs.stats.dead_lettered
        counts[reason] = counts.get(reason, 0) + 1
        name = qs.defn.settings.dead_letter_queue
        target = self.sm.use_queue(name) if name else None
        if target is None:
            return                                       # no dead-letter queue: dropped
        meta = dict(old_meta if metadata is None else metadata)
        meta.update({"x-dead-reason": reason, "x-dead-from": qs.defn.name,
                     "x-deliveries": str(deliveries), "x-dead-at": str(ctx.now_ms)})
        if error:
            meta["x-last-error"] = error
        else:
            meta.pop("x-last-error", None)
        delayed = target.defn.type is QueueType.DELAYED
        self._place(ctx, target, mid, group, 0 if delayed else priority, content, meta)
