"""The state the state machine's parts share (L3)."""
from __future__ import annotations

from typing import Any

from doq_lib.errors import ResultCode
from doq_lib.fsm.state import Ctx, QueueState, Result, Unacked
from doq_lib.lmdb_store import LmdbStore
from doq_lib.models import LeaderConfig, MemberInfo, QueueType
from doq_lib.store import U64


class MachineState:
    """What every part of the state machine shares: the state (owned and loaded by
    :class:`~doq_lib.fsm.machine.StateMachine`, which is one) and the helpers several parts
    use. Each part (QueueOps, MessageOps, LifecycleOps, ...) is given it at construction."""

    store: LmdbStore
    stats_window: int
    fault_injection: bool
    history_ms: int
    queues: dict[str, QueueState]
    by_qid: dict[int, QueueState]
    deadlines: list[tuple[int, int, int]]
    holds: list[tuple[int, int, int]]
    limit_events: list[tuple[int, int]]
    expiry_heads: list[tuple[int, int]]
    applied_index: int
    restored_version: int | None
    last_now_ms: int
    last_id: int
    next_qid: int
    leader: LeaderConfig | None
    members: dict[str, MemberInfo]
    cluster_id: str
    scheduled: dict[str, QueueState]
    woken: set[str]                     # queues with something new to deliver (this batch)
    touched: dict[str, QueueState]      # queues whose hints to refresh after this batch

    def use_queue(self, name: str) -> QueueState | None:
        """The queue ``name`` (None: no such queue), noted as changed by this batch."""
        qs = self.queues.get(name)
        if qs is not None:
            self.touched[name] = qs
        return qs

    def paused(self, name: str) -> bool:
        """Whether the queue is paused (False: not paused, or no such queue here)."""
        qs = self.queues.get(name)
        return qs is not None and qs.defn.paused

    def flush_sched(self, ctx: Ctx, qs: QueueState) -> None:
        for key, value in qs.index.drain_changes():
            if value is None:
                ctx.txn.delete("sched", qs.prefix + key)
            else:
                ctx.txn.put("sched", qs.prefix + key, value)

    def release_slot(self, qs: QueueState, slot: str, ctx: Ctx) -> None:
        qs.index.inflight_remove(slot)
        if (qs.defn.type is QueueType.FAIR or qs.defn.settings.max_in_flight) \
                and qs.index.has_ready(ctx.now_s):
            self.woken.add(qs.defn.name)

    def take_unacked(self, queue: str, mid: int) -> tuple[QueueState | None, Unacked | None]:
        qs = self.use_queue(queue)
        if qs is None:
            return None, None
        return qs, qs.unacked.get(mid)

    def delivered(self, name: str, mid: int,
                   token: Any = None) -> tuple[QueueState, Unacked] | Result:
        """Delivery ``mid`` of queue ``name`` that a settle carrying ``token`` (None: any)
        may settle: (queue, its entry), or the failure to answer."""
        qs, entry = self.take_unacked(name, mid)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if entry is None and (token is None or not qs.contains(mid)):
            return ResultCode.NOT_UNACKED, None       # (no such message: not found, token or not)
        if token is not None and (entry is None or not entry.holds(token)):
            return ResultCode.STALE_DELIVERY, None
        assert entry is not None
        return qs, entry

    def pop_delivered(self, ctx: Ctx, name: str, mid: int,
                       token: Any = None) -> tuple[QueueState, Unacked, bytes] | Result:
        """Take message ``mid`` of queue ``name`` out of the delivered ones (its unacked record
        deleted): (queue, its entry, its key), or the failure to answer (``token``: as
        :meth:`delivered`)."""
        found = self.delivered(name, mid, token)
        if not isinstance(found[0], QueueState):
            return found
        qs, entry = found
        del qs.unacked[mid]
        key = qs.prefix + U64.pack(mid)
        ctx.txn.delete("unacked", key)
        return qs, entry, key
