"""Operations on queues: create, update, delete (L3)."""
from __future__ import annotations

import dataclasses
from typing import Any

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from doq_lib.fsm.base import MachineState
from doq_lib.fsm.limits import LimitOps
from doq_lib.fsm.state import OK, Ctx, QueueState, Result
from doq_lib.models import (
    LIFECYCLE_SETTINGS,
    QueueDef,
    QueueSettings,
    QueueType,
    Strategy,
)
from doq_lib.rules import (
    FALLBACK_ACK_TIMEOUT,
    MIN_ACK_TIMEOUT,
    QUEUE_TYPES,
    lifecycle_problems,
)
from doq_lib.store import U64, encode_queue, queue_key


class QueueOps:
    def __init__(self, sm: MachineState, limits: LimitOps) -> None:
        self.sm = sm
        self.limits = limits

    def create_queue(self, ctx: Ctx, op: C.CreateQueue) -> Result:
        name = op.name
        if name in self.sm.queues:
            return OK, True                    # existed: nothing changes (as the original)
        problem, settings = _create_settings(op.type, op.strategy, op.max_unacked,
                                             op.ack_timeout,
                                             _default_timeout(op.default_ack_timeout))
        if problem:
            return ResultCode.INVALID_SETTINGS, problem
        problem, settings = self._with_lifecycle(name, settings, op.lifecycle)
        if problem:
            return ResultCode.INVALID_LIFECYCLE, problem
        defn = QueueDef(name, self.sm.next_qid, QueueType(op.type), settings)
        self.sm.next_qid += 1
        ctx.txn.put("meta", b"next_qid", U64.pack(self.sm.next_qid))
        ctx.txn.put("queues", queue_key(name), encode_queue(defn))
        qs = QueueState(defn, self.sm.stats_window)
        self.sm.queues[name] = qs
        self.sm.by_qid[defn.qid] = qs
        return OK, None

    def update_queue(self, ctx: Ctx, op: C.UpdateQueue) -> Result:
        name, strategy, max_unacked, ack_timeout = \
            op.name, op.strategy, op.max_unacked, op.ack_timeout
        qs = self.sm.use_queue(name)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        current = qs.defn.settings
        if strategy and strategy != current.strategy:
            return ResultCode.INVALID_SETTINGS, "invalid queue settings"
        if 0 < ack_timeout < MIN_ACK_TIMEOUT:
            return ResultCode.INVALID_SETTINGS, "invalid ack timeout"
        fair = qs.defn.type is QueueType.FAIR
        settings = dataclasses.replace(    # the lifecycle settings are kept unless given
            current, max_unacked=max_unacked if fair else 0,
            ack_timeout=ack_timeout or _default_timeout(op.default_ack_timeout))
        problem, settings = self._with_lifecycle(name, settings, op.lifecycle)
        if problem:
            return ResultCode.INVALID_LIFECYCLE, problem
        qs.defn = dataclasses.replace(qs.defn, settings=settings)    # pauses are kept
        ctx.txn.put("queues", queue_key(name), encode_queue(qs.defn))
        if not settings.dedup_window and qs.dedup:              # turned off: forget the keys
            ctx.txn.delete_prefix("dedup", qs.prefix)
            qs.dedup.clear()
            qs.dedup_order.clear()
        if (settings.group_rate, settings.group_burst) != (current.group_rate,
                                                           current.group_burst):
            self.limits.reset_rates(ctx, qs)       # every group starts with a full bucket
        if settings.max_in_flight != current.max_in_flight:
            self.sm.woken.add(name)
        if fair and settings.max_unacked != current.max_unacked:
            qs.index.set_max_unacked(settings.max_unacked)
            self.sm.flush_sched(ctx, qs)       # unblocked groups may have moved scheduler state
            if qs.index.has_ready(ctx.now_s):
                self.sm.woken.add(name)
        return OK, None

    def delete_queue(self, ctx: Ctx, op: C.DeleteQueue) -> Result:
        if op.name not in self.sm.queues:
            return ResultCode.QUEUE_NOT_FOUND, None
        users = sorted(other.defn.name for other in self.sm.queues.values()
                       if other.defn.settings.dead_letter_queue == op.name
                       and other.defn.name != op.name)
        if users:
            return ResultCode.QUEUE_IN_USE, users      # worded by failures.in_use_message
        qs = self.sm.queues.pop(op.name)
        del self.sm.by_qid[qs.defn.qid]
        self.sm.scheduled.pop(op.name, None)
        for db in ("messages", "unacked", "sched", "attempts", "dedup", "expiry", "rates",
                   "consumers", "schedules"):
            ctx.txn.delete_prefix(db, qs.prefix)
        ctx.txn.delete("queues", queue_key(op.name))
        return OK, None


    def _with_lifecycle(self, name: str, settings: QueueSettings,
                        given: dict[str, Any] | None) -> tuple[str | None, QueueSettings]:
        """``settings`` with the lifecycle settings ``given`` (None: none) applied, or the
        problem with them. The transports check types and ranges first; checked again here,
        with what only the state knows: the dead-letter queue must exist, must not be the
        queue itself and must not lead back to it."""
        if not given:
            return None, settings
        for key in given:
            if key not in LIFECYCLE_SETTINGS:
                return f"settings.{key}: unknown setting", settings
        # the rules of a stored record: what the store holds, a backup carries and a
        # restore accepts (a group_rate below the API's minimum counts as that minimum)
        for key, why in lifecycle_problems(given, stored=True):
            return f"settings.{key}: {why}", settings
        changes: dict[str, Any] = {
            key: float(value) if LIFECYCLE_SETTINGS[key] is float else value
            for key, value in given.items()}
        settings = dataclasses.replace(settings, **changes)
        if settings.backoff_max < settings.backoff_initial:
            return ("settings.backoff_max: must be at least backoff_initial "
                    f"({settings.backoff_max} < {settings.backoff_initial})"), settings
        dlq = settings.dead_letter_queue
        if dlq:
            if dlq == name:
                return ("settings.dead_letter_queue: a queue cannot be its own dead-letter "
                        "queue"), settings
            if dlq not in self.sm.queues:
                return f"settings.dead_letter_queue: queue {dlq!r} does not exist", settings
            path, hop = [name, dlq], self.sm.queues[dlq].defn.settings.dead_letter_queue
            while hop and hop in self.sm.queues and len(path) <= len(self.sm.queues) + 1:
                path.append(hop)
                if hop == name:
                    return ("settings.dead_letter_queue: dead letters would go round in a "
                            f"cycle ({' -> '.join(path)})"), settings
                hop = self.sm.queues[hop].defn.settings.dead_letter_queue
        return None, settings


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

