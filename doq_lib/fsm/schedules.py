"""Schedules as replicated state (L3): create or replace, delete, pause, fire.

The state machine never reads a clock or a cron expression: the leader's operations carry
the times (doq_lib/schedules.py says how they are computed). Each schedule is stored in the
``schedules`` database under its queue, so it survives failover, restart and backups, and
goes with its queue when the queue is deleted.

Firing (SCHEDULE_FIRE) is a compare-and-set on the schedule's next occurrence: it applies
only while the schedule's ``next_ms`` is still the ``after`` its proposer saw, and moves it
on. A proposal of an occurrence that already fired (a leader proposing twice, or a new
leader that had not yet applied its predecessor's fire) changes nothing. A schedule (or its
queue) that is paused fires nothing; its occurrences wait for the leader's catch-up rule
after it resumes.

Each occurrence stores one message: the schedule's message with ``x-schedule`` (its name)
and ``x-scheduled-at`` (the occurrence, ISO 8601 UTC) added to the metadata, and the dedup
key ``schedule:<name>:<occurrence ms>`` in a queue with a dedup window. A queue that refuses
it (full, with overflow reject) counts it as ``refused`` with the reason in ``last_error``;
the schedule moves on.
"""
from __future__ import annotations

import json
from typing import Callable, Iterator, NamedTuple

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from doq_lib.fsm.base import MachineState
from doq_lib.fsm.state import OK, Ctx, QueueState, Result
from doq_lib.schedules import (
    MAX_SCHEDULES,
    OCCURRENCE_KEY,
    SCHEDULE_KEY,
    Definition,
    iso,
)


class Schedule:
    """One schedule of a queue: its definition and what it did."""

    __slots__ = ("defn", "paused", "next_ms", "last_ms", "fired", "skipped", "refused",
                 "last_error", "created_ms")

    def __init__(self, defn: Definition, created_ms: int, next_ms: int = 0,
                 paused: bool = False) -> None:
        self.defn, self.created_ms, self.next_ms, self.paused = defn, created_ms, next_ms, paused
        self.last_ms = 0              # the last occurrence fired (unix ms; 0: none yet)
        self.fired = self.skipped = self.refused = 0
        self.last_error = ""

    def record(self) -> bytes:
        return json.dumps({"def": self.defn.to_json(), "paused": self.paused,
                           "next_ms": self.next_ms, "last_ms": self.last_ms,
                           "fired": self.fired, "skipped": self.skipped,
                           "refused": self.refused, "last_error": self.last_error,
                           "created_ms": self.created_ms},
                          sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_record(cls, raw: bytes) -> Schedule:
        data = json.loads(raw)
        found = cls(Definition.from_json(data["def"]), data["created_ms"], data["next_ms"],
                    data["paused"])
        found.last_ms, found.fired = data["last_ms"], data["fired"]
        found.skipped, found.refused = data["skipped"], data["refused"]
        found.last_error = data["last_error"]
        return found

    def view(self, queue: str) -> ScheduleView:
        return ScheduleView(queue, self.defn, self.paused, self.next_ms, self.last_ms,
                            self.fired, self.skipped, self.refused, self.last_error,
                            self.created_ms)


class ScheduleView(NamedTuple):
    """A schedule as the read API answers it (a copy)."""

    queue: str
    defn: Definition
    paused: bool
    next_ms: int                  # 0: it has ended (no occurrence left)
    last_ms: int                  # 0: never fired
    fired: int
    skipped: int                  # missed occurrences its catch_up rule did not fire
    refused: int                  # occurrences its queue refused (full)
    last_error: str
    created_ms: int


def _key(qs: QueueState, name: str) -> bytes:
    return qs.prefix + name.encode()


def load(qs: QueueState, records: list[tuple[bytes, bytes]]) -> None:
    """The queue's schedules from their records (keys without the qid)."""
    qs.schedules = {raw_name.decode(): Schedule.from_record(value)
                    for raw_name, value in records}


def outcomes(qs: QueueState) -> dict[str, int] | None:
    """The occurrences the queue's schedules fired, skipped and had refused, summed (None:
    it has no schedules)."""
    if not qs.schedules:
        return None
    found = list(qs.schedules.values())
    return {"fired": sum(s.fired for s in found), "skipped": sum(s.skipped for s in found),
            "refused": sum(s.refused for s in found)}


class ScheduleOps:
    def __init__(self, sm: MachineState, enqueue: Callable[[Ctx, C.Enqueue], Result]) -> None:
        self.sm = sm
        self.enqueue = enqueue                  # MessageOps.enqueue: a fired schedule's message

    def _save_schedule(self, ctx: Ctx, qs: QueueState, schedule: Schedule) -> None:
        ctx.txn.put("schedules", _key(qs, schedule.defn.name), schedule.record())

    def put(self, ctx: Ctx, op: C.SchedulePut) -> Result:
        """Create a schedule, or replace the definition of the one of that name (its counts
        stay; it restarts from ``next_ms``). The same definition again changes nothing."""
        qs = self.sm.use_queue(op.queue)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        try:
            defn = Definition.from_json(op.definition)
        except (KeyError, TypeError):
            return ResultCode.BAD_COMMAND, "malformed schedule"
        found = qs.schedules.get(defn.name)
        if found is not None and found.defn.same_as(defn):
            return OK, ("unchanged", found.view(op.queue))
        if found is None:
            if len(qs.schedules) >= MAX_SCHEDULES:
                return ResultCode.INVALID_CONTROL, (
                    f"queue {op.queue!r} has {len(qs.schedules)} schedules, the most allowed: "
                    "delete one first")
            found = qs.schedules[defn.name] = Schedule(defn, ctx.now_ms, op.next_ms,
                                                       op.paused)
            self.sm.scheduled[op.queue] = qs
            status = "created"
        else:
            found.defn, found.next_ms = defn, op.next_ms
            status = "replaced"
        self._save_schedule(ctx, qs, found)
        return OK, (status, found.view(op.queue))

    def delete(self, ctx: Ctx, op: C.ScheduleRef) -> Result:
        qs = self.sm.use_queue(op.queue)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        if qs.schedules.pop(op.name, None) is None:
            return ResultCode.SCHEDULE_NOT_FOUND, op.name
        if not qs.schedules:
            self.sm.scheduled.pop(op.queue, None)
        ctx.txn.delete("schedules", _key(qs, op.name))
        return OK, None

    def pause(self, ctx: Ctx, op: C.SchedulePause) -> Result:
        """Pause or resume one schedule; answers whether anything changed."""
        qs = self.sm.use_queue(op.queue)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        found = qs.schedules.get(op.name)
        if found is None:
            return ResultCode.SCHEDULE_NOT_FOUND, op.name
        if found.paused == op.paused:
            return OK, False
        found.paused = op.paused
        self._save_schedule(ctx, qs, found)
        return OK, True

    def fire(self, ctx: Ctx, op: C.ScheduleFire) -> Result:
        """Store the message of each occurrence in ``fired`` if the schedule's next
        occurrence is still ``after``; answers the ids stored (None: it had moved on, or is
        paused: nothing changed)."""
        qs = self.sm.use_queue(op.queue)
        if qs is None:
            return ResultCode.QUEUE_NOT_FOUND, None
        found = qs.schedules.get(op.name)
        if found is None:
            return ResultCode.SCHEDULE_NOT_FOUND, op.name
        if found.next_ms != op.after or found.paused or qs.defn.paused:
            return OK, None
        defn = found.defn
        message = defn.message
        ids: list[int] = []
        for at in op.fired:
            metadata = dict(message.get("metadata") or {})
            metadata[SCHEDULE_KEY] = defn.name
            metadata[OCCURRENCE_KEY] = iso(at)
            code, value = self.enqueue(ctx, C.Enqueue(
                op.queue, 0, message.get("group") or "", message.get("priority") or 0,
                message["content"], metadata, f"schedule:{defn.name}:{at}",
                message.get("ttl") or 0))
            if code == OK:
                ids.append(value[0])
            else:
                found.refused += 1
                found.last_error = (f"the occurrence of {iso(at)} was refused: "
                                    f"{ResultCode(code).name.lower()}")
            found.last_ms = max(found.last_ms, at)
        found.fired += len(ids)
        found.skipped += op.skipped
        found.next_ms = op.next_ms
        self._save_schedule(ctx, qs, found)
        return OK, ids

    # -- the read API (values read once: see StateMachine's) -----------------------------
    def schedule_views(self, queue: str, name: str = "") -> list[ScheduleView] | None:
        """The queue's schedules by name (``name``: that one only); None: no such queue."""
        qs = self.sm.queues.get(queue)
        if qs is None:
            return None
        found = dict(qs.schedules) if not name else \
            {name: qs.schedules[name]} if name in qs.schedules else {}
        return [found[n].view(queue) for n in sorted(found)]

    def _may_fire(self) -> Iterator[tuple[str, Schedule]]:
        """(queue, schedule) of every schedule with a next occurrence that may fire
        (neither it nor its queue paused)."""
        for qs in list(self.sm.scheduled.values()):
            if not qs.defn.paused:
                for schedule in list(qs.schedules.values()):
                    if not schedule.paused and schedule.next_ms:
                        yield qs.defn.name, schedule

    def due_schedules(self, now_ms: int) -> list[ScheduleView]:
        """Schedules that may fire whose next occurrence is at or before ``now_ms``."""
        return [s.view(queue) for queue, s in self._may_fire() if s.next_ms <= now_ms]

    def next_schedule_ms(self) -> int:
        """The earliest next occurrence of a schedule that may fire (0: none)."""
        return min((s.next_ms for _, s in self._may_fire()), default=0)

    def scan_schedules(self, now_ms: int, chunk: int,
                       ) -> Iterator[tuple[list[ScheduleView], int]]:
        """Every schedule that may fire, looked at ``chunk`` at a time (the caller may yield
        between two chunks: what it reads is a copy): per chunk, the due ones and the
        earliest next occurrence of the others (0: none)."""
        due: list[ScheduleView] = []
        soonest = 0
        for looked, (queue, schedule) in enumerate(self._may_fire(), 1):
            at = schedule.next_ms
            if at <= now_ms:
                due.append(schedule.view(queue))
            elif not soonest or at < soonest:
                soonest = at
            if looked % chunk == 0:
                yield due, soonest
                due, soonest = [], 0
        yield due, soonest

