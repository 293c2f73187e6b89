"""Operator controls (L3): purge, pause and resume a queue or a fair queue's group.

A pause is state like any other: it is written in the queue's record (``paused``,
``paused_groups``), so it survives a failover, a restart and a backup, and every replica
skips the same groups. A paused queue takes enqueues, acks and nacks and delivers nothing; a
paused group (and its sub-groups: ``a`` covers ``a.b``) is skipped by the fair scheduler as
if it had nothing ready, and the other groups keep their order.
"""
from __future__ import annotations

import dataclasses

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from doq_lib.fsm import consumers
from doq_lib.fsm.base import MachineState
from doq_lib.fsm.lifecycle import LifecycleOps
from doq_lib.fsm.state import OK, Ctx, QueueState, Result
from doq_lib.models import QueueType
from doq_lib.rules import MAX_PAUSED_GROUPS, group_problem
from doq_lib.store import U64, encode_queue, queue_key


class ControlOps:
    def __init__(self, sm: MachineState, lifecycle: LifecycleOps) -> None:
        self.sm = sm
        self.lifecycle = lifecycle

    def purge(self, ctx: Ctx, op: C.Purge) -> Result:
        """Drop every waiting message (ready, scheduled, held back) and, with
        ``include_unacked``, every delivered one; their delivery counts and expiries go too
        (dedup keys stay: a retried producer must not store a purged message again)."""
        qs = self.sm.use_queue(op.queue)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        count = 0
        for mid in sorted(qs.index.ready_ids()):
            qs.index.remove(mid)
            self._drop(ctx, qs, mid)
            count += 1
        for mid in sorted(qs.held):
            del qs.held[mid]
            self._drop(ctx, qs, mid)
            count += 1
        if op.include_unacked:
            for mid in sorted(qs.unacked):
                entry = qs.unacked.pop(mid)
                consumers.lease_ended(ctx, qs, mid, entry)
                ctx.txn.delete("unacked", qs.prefix + U64.pack(mid))
                qs.index.inflight_remove(entry.slot)
                self._drop(ctx, qs, mid)
                count += 1
        qs.stats.purged += count
        self.sm.flush_sched(ctx, qs)
        return OK, count

    def _drop(self, ctx: Ctx, qs: QueueState, mid: int) -> None:
        key = qs.prefix + U64.pack(mid)
        ctx.txn.delete("messages", key)
        self.lifecycle.forget_attempts(ctx, qs, mid, key)
        if mid in qs.expires:
            self.lifecycle.set_expiry(ctx, qs, mid, 0)

    def set_paused(self, ctx: Ctx, op: C.SetPaused) -> Result:
        """Pause or resume the queue (group "") or one group of a fair queue. Answers
        whether anything changed (pausing what is paused is not an error)."""
        qs = self.sm.use_queue(op.queue)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        defn = qs.defn
        if not op.group:
            if defn.paused == op.paused:
                return OK, False
            qs.defn = dataclasses.replace(defn, paused=op.paused)
        else:
            if defn.type is not QueueType.FAIR:
                return ResultCode.INVALID_CONTROL, (
                    f"queue {defn.name!r} is a delayed queue: only the groups of a fair "
                    "queue can be paused")
            problem = group_problem(op.group, stored=True)
            if problem is not None:
                return ResultCode.INVALID_CONTROL, f"group: {problem.value}"
            groups = set(defn.paused_groups)
            if (op.group in groups) == op.paused:
                return OK, False
            if op.paused and len(groups) >= MAX_PAUSED_GROUPS:
                return ResultCode.INVALID_CONTROL, (
                    f"queue {defn.name!r} has {len(groups)} paused groups, the most allowed: "
                    "resume one first")
            if op.paused:
                groups.add(op.group)
            else:
                groups.discard(op.group)
            qs.defn = dataclasses.replace(defn, paused_groups=tuple(sorted(groups)))
            qs.index.set_paused(qs.defn.paused_groups)
            self.sm.flush_sched(ctx, qs)
        ctx.txn.put("queues", queue_key(defn.name), encode_queue(qs.defn))
        if not op.paused:
            self.sm.woken.add(defn.name)                # waiting consumers look again
        return OK, True
