"""Schedules over the log (L4): the operations the transports call, and the leader's loop
that fires what is due.

The definitions and the firing rules are in doq_lib/schedules.py, the replicated state in
doq_lib/fsm/schedules.py. Only the leader fires: it looks at the schedules whose next
occurrence has come, plans each (on time, missed, ``catch_up``) at its own time and proposes
one SCHEDULE_FIRE per schedule. The state machine applies a fire only if the schedule has not
moved on meanwhile, so a leader that proposes twice, or two leaders in a row, fire an
occurrence once.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import gevent
import gevent.pool

from doq_lib import commands as C
from doq_lib import schedules
from doq_lib.clock import now_ms
from doq_lib.errors import DoqError, InvalidSchedule, ResultCode
from doq_lib.failures import error_for_result
from doq_lib.fsm.schedules import ScheduleView

if TYPE_CHECKING:
    from doq_lib.service import Service

log = logging.getLogger(__name__)

IDLE_WAIT = 0.5          # seconds between two looks when nothing is due sooner
MIN_WAIT = 0.005
FIRES_AT_ONCE = 64       # fires the leader proposes at once (each one schedule's due occurrences)


class Scheduler:
    """A node's side of schedules (``Service.scheduler``)."""

    def __init__(self, service: Service, run: Callable[[C.Op, str], Any]) -> None:
        self.svc = service
        self._run = run                  # proposes an operation, raises its failure
        self.fired = 0                   # occurrences this node fired as leader (metrics)
        self.rounds_failed = 0
        self._unplanned: set[tuple[str, str, int]] = set()     # logged already

    # -- operations --------------------------------------------------------------------------
    def put(self, queue: str, name: str, message: dict[str, Any], cron: str = "",
            every: int | None = None, timezone: str = "", start_at: int = 0, end_at: int = 0,
            catch_up: str = schedules.DEFAULT_CATCH_UP, grace: int = schedules.DEFAULT_GRACE,
            paused: bool = False) -> tuple[str, ScheduleView]:
        """Create the schedule ``name`` of ``queue``, or replace its definition (its counts
        stay; it starts again from now). ``message``: an enqueue's fields, checked by the
        transport. Answers ("created" | "replaced" | "unchanged", the schedule)."""
        now = now_ms(self.svc.clock)
        try:
            defn = schedules.define(name, message, now, cron, every, timezone, start_at,
                                    end_at, catch_up, grace)
        except schedules.ScheduleError as exc:
            raise InvalidSchedule(exc.field, exc.message) from None
        next_ms = schedules.next_after(defn, now - 1)
        status, view = self._run(C.schedule_put(queue, defn.to_json(), next_ms, paused), queue)
        return status, view

    def list(self, queue: str, name: str = "") -> list[ScheduleView]:
        """The queue's schedules (``name``: that one only, ScheduleNotFound if it has none
        by that name), from this replica."""
        found = self.svc.fsm.serialize(lambda: self.svc.fsm.schedule_views(queue, name))
        if found is None:
            raise error_for_result("schedule_put", ResultCode.QUEUE_NOT_FOUND, queue)
        if name and not found:
            raise error_for_result("schedule_pause", ResultCode.SCHEDULE_NOT_FOUND, queue,
                                   name)
        return found  # type: ignore[no-any-return]

    def delete(self, queue: str, name: str) -> None:
        self._run(C.schedule_delete(queue, name), queue)

    def set_paused(self, queue: str, name: str, paused: bool) -> bool:
        """Pause or resume one schedule: whether that changed anything."""
        return self._run(C.schedule_pause(queue, name, paused), queue)  # type: ignore[no-any-return]

    # -- the leader's loop ---------------------------------------------------------------------
    def run(self) -> None:
        """Fire what is due while this node leads; sleep until the next occurrence."""
        while True:
            try:
                wait = self.round()
            except Exception:                      # noqa: BLE001 - the loop must go on
                log.exception("schedule round failed")
                wait = IDLE_WAIT
            gevent.sleep(wait)

    def round(self) -> float:
        """Fire every due schedule once; seconds to wait before the next round."""
        svc = self.svc
        if not svc.proposer.is_leader:
            return IDLE_WAIT
        now = now_ms(svc.clock)
        fires = []
        for view in svc.fsm.due_schedules(now):
            try:
                plan = schedules.plan(view.defn, view.next_ms, now)
            except Exception:                      # noqa: BLE001 - one schedule, not all
                key = (view.queue, view.defn.name, view.next_ms)
                if key not in self._unplanned:          # once per occurrence, not per round
                    if len(self._unplanned) > 10_000:
                        self._unplanned.clear()
                    self._unplanned.add(key)
                    log.exception("schedule %r of queue %r could not be planned",
                                  view.defn.name, view.queue)
                continue
            if plan is not None:
                fires.append((view, plan))
        # proposed together (the committer puts them in as few entries as it can), a bounded
        # number at a time
        outcomes = gevent.pool.Pool(FIRES_AT_ONCE).map(self._fire, fires)
        if any(outcome is None for outcome in outcomes):
            return IDLE_WAIT                         # the cluster refused: look again later
        if any(outcome and plan.next_ms and plan.next_ms <= now
               for outcome, (_, plan) in zip(outcomes, fires)):
            return 0.0                               # catching up: the next batch at once
        soonest = svc.fsm.next_schedule_ms()
        wait = (soonest - now_ms(svc.clock)) / 1000
        if not soonest or wait <= 0:      # (one still due was not fired: look again later)
            return IDLE_WAIT
        return min(IDLE_WAIT, max(MIN_WAIT, wait))

    def _fire(self, due: tuple[ScheduleView, schedules.Plan]) -> bool | None:
        """Propose one schedule's fire: whether it applied (False: the schedule had moved
        on), None when the cluster refused it."""
        view, plan = due
        op = C.schedule_fire(view.queue, view.defn.name, plan.after, plan.fired, plan.skipped,
                             plan.next_ms)
        try:
            code, ids = self.svc.submit(op)
        except DoqError as exc:
            self.rounds_failed += 1
            log.info("schedule %r of queue %r not fired: %s", view.defn.name, view.queue, exc)
            return None
        if code != ResultCode.OK or ids is None:
            return False
        self.fired += len(ids)
        return True
