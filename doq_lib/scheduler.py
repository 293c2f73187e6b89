"""The leader's loops over due work (L4): schedules over the log (the operations the
transports call, and the loop that fires what is due) and the rounds of redelivery, held
messages, TTL expiry and idle consumers (:class:`Rounds`). Both are bounded per round and
yield between rounds, however much is due.

The definitions and the firing rules are in doq_lib/schedules.py, the replicated state in
doq_lib/fsm/schedules.py. Only the leader fires: it looks at the schedules whose next
occurrence has come, plans each (on time, missed, ``catch_up``) at its own time and proposes
one SCHEDULE_FIRE per schedule. The state machine applies a fire only if the schedule has not
moved on meanwhile, so a leader that proposes twice, or two leaders in a row, fire an
occurrence once.
"""
from __future__ import annotations

import functools
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import gevent
import gevent.pool

from doq_lib import commands as C
from doq_lib import schedules
from doq_lib.clock import now_ms
from doq_lib.errors import DoqError, InvalidSchedule, ResultCode
from doq_lib.failures import error_for_result
from doq_lib.fsm.lifecycle import ROUND_BUDGET, ROUND_QUEUES
from doq_lib.fsm.schedules import ScheduleView

if TYPE_CHECKING:
    from doq_lib.service import Service

log = logging.getLogger(__name__)

IDLE_WAIT = 0.5          # seconds between two looks when nothing is due sooner
MIN_WAIT = 0.005
FIRES_AT_ONCE = 64       # fires the leader proposes at once (each one schedule's due occurrences)
ROUND_FIRES = 512        # due schedules one round plans and proposes, at most
SCAN_CHUNK = 2000        # schedules looked at between two yields
PLAN_SLICE = 0.005       # seconds of planning between two yields
FORGET_EVERY = 10.0      # seconds between two passes over the queues for idle consumers
# (the class's own ``list`` method would shadow the builtin in its annotations)
Views = list[ScheduleView]
Fires = list[tuple[ScheduleView, schedules.Plan]]


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
        """Fire the schedules that are due, the earliest first and at most ROUND_FIRES of
        them; seconds to wait before the next round (0: more are due).

        However many schedules there are and however long they were missed, a round never
        holds the event loop for long: it looks at SCAN_CHUNK schedules between two yields,
        plans for at most PLAN_SLICE seconds between two yields (planning one schedule costs
        the same whether it was missed a minute or a year: schedules.plan counts), and
        proposes at most FIRES_AT_ONCE fires at a time."""
        svc = self.svc
        if not svc.proposer.is_leader:
            return IDLE_WAIT
        now = now_ms(svc.clock)
        due: Views = []
        soonest = 0
        for chunk, later in svc.fsm.scan_schedules(now, SCAN_CHUNK):
            due += chunk
            if later and (not soonest or later < soonest):
                soonest = later
            gevent.sleep(0)
        if not svc.proposer.is_leader:
            return IDLE_WAIT
        more = len(due) > ROUND_FIRES
        if more:
            due.sort(key=lambda view: view.next_ms)
            del due[ROUND_FIRES:]
        fires = self._plan(due, now)
        # proposed together (the committer puts them in as few entries as it can), a bounded
        # number at a time
        outcomes = gevent.pool.Pool(FIRES_AT_ONCE).map(self._fire, fires)
        if any(outcome is None for outcome in outcomes):
            return IDLE_WAIT                         # the cluster refused: look again later
        if more or any(outcome and plan.next_ms and plan.next_ms <= now
                       for outcome, (_, plan) in zip(outcomes, fires)):
            return 0.0                               # catching up: the next batch at once
        for _, plan in fires:
            if plan.next_ms and (not soonest or plan.next_ms < soonest):
                soonest = plan.next_ms
        wait = (soonest - now_ms(svc.clock)) / 1000
        if not soonest or wait <= 0:      # (one still due was not fired: look again later)
            return IDLE_WAIT
        return min(IDLE_WAIT, max(MIN_WAIT, wait))

    def _plan(self, due: Views, now: int) -> Fires:
        """What to propose for each due schedule, yielding every PLAN_SLICE seconds."""
        fires: Fires = []
        slice_end = time.monotonic() + PLAN_SLICE
        for view in due:
            if time.monotonic() > slice_end:
                gevent.sleep(0)
                slice_end = time.monotonic() + PLAN_SLICE
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
        return fires

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


class Rounds:
    """The leader's rounds (``Service.rounds``): deliveries whose lease ran out, holds that
    ended, TTL expiry and idle consumers, as REQUEUE_EXPIRED operations of at most
    ROUND_BUDGET messages (fsm/messages.py's requeue_expired)."""

    def __init__(self, service: Service, run: Callable[[C.Op], Any]) -> None:
        self.svc = service
        self._run = run                  # proposes an operation, raises its failure

    def run(self) -> None:
        """Every acknowledgement_check_interval, on every node: this node's TTL index is
        trimmed; the leader proposes a round when something is due (again at once while a
        bounded round left some), looks at idle consumers ROUND_QUEUES queues at a time
        (a pass over every queue with consumers, then FORGET_EVERY seconds of rest), and
        otherwise ticks to keep the log's clock near its own."""
        svc = self.svc
        interval = svc.cfg.queue.acknowledgement_check_interval
        forget: Iterator[int] = iter(())
        next_forget = 0.0
        wait = float(interval)
        while True:
            gevent.sleep(wait)
            wait = interval
            now = now_ms(svc.clock)
            expiring = svc.fsm.serialize(functools.partial(svc.fsm.expiry_due, now,
                                                           ROUND_QUEUES))
            if not svc.proposer.is_leader:
                continue
            due = svc.fsm.next_deadline_ms()
            named: list[int] = []
            if time.monotonic() >= next_forget:
                named = list(itertools.islice(forget, ROUND_QUEUES))
                if len(named) < ROUND_QUEUES:          # this pass is over: rest, then anew
                    forget = iter([qs.defn.qid for qs in list(svc.fsm.queues.values())
                                   if qs.consumers])
                    next_forget = time.monotonic() + FORGET_EVERY
            if (due is not None and due <= now) or expiring or named:
                op = C.requeue_expired(ROUND_BUDGET, expiring, named)
            elif time.monotonic() - svc.proposer.last_proposal > 1.0:
                op = C.tick()        # keep the log's clock near the leader's (entry deadlines)
            else:
                continue
            try:
                handled = self._run(op)
            except DoqError as exc:
                log.info("%s round failed: %s", C.name_of(op), exc)
                continue
            if op[0] == C.REQUEUE_EXPIRED and handled >= ROUND_BUDGET:
                wait = 0                # more was due than one round takes: the next at once
