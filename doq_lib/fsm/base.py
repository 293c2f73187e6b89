"""The base of the state machine's parts (L3)."""
from __future__ import annotations

from typing import Any

from doq_lib.errors import ResultCode
from doq_lib.fsm.state import Ctx, QueueState, Result, Unacked
from doq_lib.lmdb_store import LmdbStore, LmdbTxn
from doq_lib.models import LeaderConfig, MemberInfo, QueueType
from doq_lib.store import U64


class Machine:
    """What every part of the state machine shares: its state (set up by StateMachine) and
    the helpers the operations of several parts use."""

    store: LmdbStore
    stats_window: int
    fault_injection: bool
    history_ms: int
    queues: dict[str, QueueState]
    by_qid: dict[int, QueueState]
    deadlines: list[tuple[int, int, int]]
    holds: list[tuple[int, int, int]]
    limit_events: list[tuple[int, int]]
    applied_index: int
    restored_version: int | None
    last_now_ms: int
    last_id: int
    next_qid: int
    leader: LeaderConfig | None
    members: dict[str, MemberInfo]
    cluster_id: str
    scheduled: dict[str, QueueState]
    _woken: set[str]
    _touched: dict[str, QueueState]

    def _load(self, txn: LmdbTxn) -> None:
        """Rebuild every in-memory index from the store (StateMachine's)."""
        raise NotImplementedError

    def _reset_rates(self, ctx: Ctx, qs: QueueState) -> None:
        """Every group of the queue starts again with a full bucket (LimitOps')."""
        raise NotImplementedError

    def _enqueue(self, ctx: Ctx, op: Any) -> Result:
        """Store one message (MessageOps')."""
        raise NotImplementedError

    def _queue(self, name: str) -> QueueState | None:
        qs = self.queues.get(name)
        if qs is not None:
            self._touched[name] = qs
        return qs

    def _flush_sched(self, ctx: Ctx, qs: QueueState) -> None:
        for key, value in qs.index.drain_changes():
            if value is None:
                ctx.txn.delete("sched", qs.prefix + key)
            else:
                ctx.txn.put("sched", qs.prefix + key, value)

    def _release_slot(self, qs: QueueState, slot: str, ctx: Ctx) -> None:
        qs.index.inflight_remove(slot)
        if (qs.defn.type is QueueType.FAIR or qs.defn.settings.max_in_flight) \
                and qs.index.has_ready(ctx.now_s):
            self._woken.add(qs.defn.name)

    def _take_unacked(self, queue: str, mid: int) -> tuple[QueueState | None, Unacked | None]:
        qs = self._queue(queue)
        if qs is None:
            return None, None
        return qs, qs.unacked.get(mid)

    def _delivered(self, name: str, mid: int,
                   token: Any = None) -> tuple[QueueState, Unacked] | Result:
        """Delivery ``mid`` of queue ``name`` that a settle carrying ``token`` (None: any)
        may settle: (queue, its entry), or the failure to answer."""
        qs, entry = self._take_unacked(name, mid)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if token is not None and (entry is None or not entry.holds(token)):
            return ResultCode.STALE_DELIVERY, None
        if entry is None:
            return ResultCode.NOT_UNACKED, None
        return qs, entry

    def _pop_delivered(self, ctx: Ctx, name: str, mid: int,
                       token: Any = None) -> tuple[QueueState, Unacked, bytes] | Result:
        """Take message ``mid`` of queue ``name`` out of the delivered ones (its unacked record
        deleted): (queue, its entry, its key), or the failure to answer (``token``: as
        :meth:`_delivered`)."""
        found = self._delivered(name, mid, token)
        if not isinstance(found[0], QueueState):
            return found
        qs, entry = found
        del qs.unacked[mid]
        key = qs.prefix + U64.pack(mid)
        ctx.txn.delete("unacked", key)
        return qs, entry, key
