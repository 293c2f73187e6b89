"""Delivery limits (L3): a queue-wide cap on messages in flight (``max_in_flight``)
and a rate per group (``group_rate`` deliveries per second, ``group_burst`` at once).

The rate is the generic cell rate algorithm, in integer microseconds and driven only by the
time of the operations (the leader's proposed time), so every replica makes the same
choices: each group has a theoretical arrival time (TAT); a delivery at ``now`` is allowed
when ``TAT - tau <= now`` (tau = (burst - 1) x interval) and moves TAT to
``max(TAT, now) + interval``. A group whose next delivery is not yet allowed is skipped by
the scheduler (others are served as if it were absent) until its release time; its TAT is
stored (database ``rates``) until its bucket is full again, then forgotten.
"""
from __future__ import annotations

import heapq
import logging

from doq_lib.fsm.base import MachineState
from doq_lib.fsm.state import Ctx, QueueState
from doq_lib.rules import MAX_RATE_INTERVAL
from doq_lib.store import U64

log = logging.getLogger(__name__)
MAX_INTERVAL_US = MAX_RATE_INTERVAL * 1_000_000
TAT_MAX = (1 << 63) - 1           # what a rate record may hold (a backup's rule too)


def rate_interval_us(rate: float) -> int:
    """Microseconds between two deliveries of a group at ``rate`` per second: from 1 to
    MAX_INTERVAL_US whatever ``rate`` is (a stored rate slower than the API allows, a
    subnormal, 0 or NaN count as the slowest), so no setting can make it overflow."""
    if not rate > 0:
        return MAX_INTERVAL_US
    interval = 1_000_000 / rate                  # inf for a subnormal rate: no exception
    if not interval < MAX_INTERVAL_US:
        return MAX_INTERVAL_US
    return max(1, round(interval))


class LimitOps:
    def __init__(self, sm: MachineState) -> None:
        self.sm = sm

    @staticmethod
    def at_max_in_flight(qs: QueueState) -> bool:
        cap = qs.defn.settings.max_in_flight
        return bool(cap) and len(qs.unacked) >= cap

    def rate_take(self, ctx: Ctx, qs: QueueState, group: str) -> None:
        """A message of ``group`` was just delivered: spend its share of the rate."""
        settings = qs.defn.settings
        interval = rate_interval_us(settings.group_rate)
        now = ctx.now_ms * 1000
        tat = min(max(qs.rate_tat.get(group, 0), now) + interval, TAT_MAX)
        qs.rate_tat[group] = tat
        ctx.txn.put("rates", qs.prefix + group.encode(), U64.pack(tat))
        release = tat - (settings.group_burst - 1) * interval
        if release > now:                       # no delivery left for now: skip the group
            qs.index.set_limited(group, True)
            heapq.heappush(qs.rate_release, (release, group))
            heapq.heappush(self.sm.limit_events, (release, qs.defn.qid))
            qs.stats.rate_limited += 1
        else:
            heapq.heappush(qs.rate_forget, (tat, group))
            heapq.heappush(self.sm.limit_events, (tat, qs.defn.qid))

    def due_limits(self, ctx: Ctx) -> None:
        """Run the rate events whose time has come, before an entry's operations: after
        every entry all due events of every queue are done, on every replica alike (a
        replica that loads its state at that point rebuilds exactly that)."""
        heap, now = self.sm.limit_events, ctx.now_ms * 1000
        while heap and heap[0][0] <= now:
            _, qid = heapq.heappop(heap)
            qs = self.sm.by_qid.get(qid)
            if qs is None:
                continue
            try:
                self._rate_release(ctx, qs)
            except Exception:  # noqa: BLE001 - runs before every entry: must never raise
                # A bug here would fail every later entry on every replica. Every replica
                # meets it at the same point and does the same: the queue's groups start
                # again with a full bucket.
                log.exception("queue %r: a rate event failed; its rate state is reset",
                              qs.defn.name)
                self.reset_rates(ctx, qs)

    def _rate_release(self, ctx: Ctx, qs: QueueState) -> bool:
        """Let the groups whose release time has come deliver again, and forget the records
        of groups whose bucket is full; whether any group was let go."""
        now = ctx.now_ms * 1000
        settings = qs.defn.settings
        tau = (settings.group_burst - 1) * rate_interval_us(settings.group_rate) \
            if settings.group_rate else 0
        released = False
        heap = qs.rate_release
        while heap and heap[0][0] <= now:
            at, group = heapq.heappop(heap)
            tat = qs.rate_tat.get(group)
            if tat is None or tat - tau != at:
                continue                                   # superseded or reset since
            qs.index.set_limited(group, False)
            released = True
            heapq.heappush(qs.rate_forget, (tat, group))
            heapq.heappush(self.sm.limit_events, (tat, qs.defn.qid))
        heap = qs.rate_forget
        while heap and heap[0][0] <= now:
            at, group = heapq.heappop(heap)
            if qs.rate_tat.get(group) == at:               # nothing delivered since
                del qs.rate_tat[group]
                ctx.txn.delete("rates", qs.prefix + group.encode())
        if released:
            self.sm.flush_sched(ctx, qs)
            self.sm.woken.add(qs.defn.name)
            self.sm.touched[qs.defn.name] = qs
        return released

    def reset_rates(self, ctx: Ctx, qs: QueueState) -> None:
        """Every group of the queue starts again with a full bucket (its rate changed)."""
        for group in list(qs.rate_tat):
            qs.index.set_limited(group, False)
        qs.rate_tat.clear()
        qs.rate_release.clear()
        qs.rate_forget.clear()
        ctx.txn.delete_prefix("rates", qs.prefix)
        self.sm.flush_sched(ctx, qs)
        self.sm.woken.add(qs.defn.name)

    def load_rates(self, qs: QueueState, records: list[tuple[bytes, bytes]]) -> None:
        """Rebuild the rate state from the stored TATs at the state's own time (every
        event due by then was run when the last entry was applied)."""
        now = self.sm.last_now_ms * 1000
        settings = qs.defn.settings
        if not settings.group_rate:
            return
        tau = (settings.group_burst - 1) * rate_interval_us(settings.group_rate)
        for raw_group, raw in records:
            group, tat = raw_group.decode(), U64.unpack(raw)[0]
            qs.rate_tat[group] = tat
            if tat - tau > now:
                qs.index.set_limited(group, True)
                qs.rate_release.append((tat - tau, group))
            else:
                qs.rate_forget.append((tat, group))
        heapq.heapify(qs.rate_release)
        heapq.heapify(qs.rate_forget)
        self.sm.limit_events.extend((at, qs.defn.qid) for at, _ in qs.rate_release)
        self.sm.limit_events.extend((at, qs.defn.qid) for at, _ in qs.rate_forget)
