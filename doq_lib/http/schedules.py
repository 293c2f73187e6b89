"""The REST API's schedules (L5): create or replace, list, show, delete, pause and resume
the schedules of a queue (doq_lib/schedules.py says how they fire). Held by
:class:`doq_lib.http.api.Api` as ``schedules``."""
from __future__ import annotations

from typing import Any

from doq_lib import schedules
from doq_lib.errors import InvalidSchedule
from doq_lib.fsm.schedules import ScheduleView
from doq_lib.http.calls import HttpProblem, reply
from doq_lib.http.parsing import json_body
from doq_lib.service import Service


def _seconds(ms: int) -> int | None:
    return ms // 1000 if ms else None


def schedule_out(view: ScheduleView) -> dict[str, Any]:
    """A schedule as answered: its definition, then its state (times in unix seconds;
    next_at null: it has ended)."""
    defn = view.defn
    out: dict[str, Any] = {"name": defn.name}
    if defn.cron:
        out.update(cron=defn.cron, timezone=defn.timezone)
    else:
        out["every"] = defn.every
    out["message"] = defn.message
    if defn.start_ms:
        out["start_at"] = defn.start_ms // 1000
    if defn.end_ms:
        out["end_at"] = defn.end_ms // 1000
    out.update(catch_up=defn.catch_up, grace=defn.grace, paused=view.paused,
               next_at=_seconds(view.next_ms), last_fired=_seconds(view.last_ms),
               fired=view.fired, skipped=view.skipped, refused=view.refused,
               last_error=view.last_error or None, created_at=_seconds(view.created_ms))
    return out


def _name(name: str) -> str:
    try:
        schedules.check_name(name)
    except schedules.ScheduleError as exc:
        raise HttpProblem(422, "validation failed", [
            {"message": exc.message, "location": "path.name", "value": name}]) from None
    return name


class SchedulesApi:
    """The schedule routes' handlers (``api.schedules``)."""

    def __init__(self, service: Service) -> None:
        self.svc = service

    def put_schedule(self, queue_name: str) -> bytes:
        """Create a schedule, or replace the definition of the one of that name."""
        body = json_body("ScheduleInputBody")
        try:
            status, view = self.svc.scheduler.put(
                queue_name, body["name"], body["message"], body.get("cron") or "",
                body.get("every"), body.get("timezone") or "", body.get("start_at") or 0,
                body.get("end_at") or 0, body.get("catch_up") or schedules.DEFAULT_CATCH_UP,
                body.get("grace") or schedules.DEFAULT_GRACE, bool(body.get("paused")))
        except InvalidSchedule as exc:
            raise HttpProblem(422, "validation failed", [
                {"message": exc.message, "location": f"body.{exc.field}",
                 "value": body.get(exc.field)}]) from None
        return reply(200, {"status": status.upper(), "schedule": schedule_out(view)})

    def schedules(self, queue_name: str) -> bytes:
        return reply(200, {"schedules": [schedule_out(v)
                                          for v in self.svc.scheduler.list(queue_name)]})

    def schedule(self, queue_name: str, name: str) -> bytes:
        (view,) = self.svc.scheduler.list(queue_name, _name(name))
        return reply(200, schedule_out(view))

    def delete_schedule(self, queue_name: str, name: str) -> bytes:
        self.svc.scheduler.delete(queue_name, _name(name))
        return reply(200, {"status": "DELETED", "name": name})

    def pause_schedule(self, queue_name: str, name: str) -> bytes:
        changed = self.svc.scheduler.set_paused(queue_name, _name(name), True)
        return reply(200, {"status": "PAUSED", "name": name, "changed": changed})

    def resume_schedule(self, queue_name: str, name: str) -> bytes:
        changed = self.svc.scheduler.set_paused(queue_name, _name(name), False)
        return reply(200, {"status": "RESUMED", "name": name, "changed": changed})


_ONE = "/API/v1/queues/<queue_name>/schedules/<name>"
ROUTES: list[tuple[str, str, str, str]] = [     # method, path, op id, handler
    ("POST", "/API/v1/queues/<queue_name>/schedules", "put-schedule", "schedules.put_schedule"),
    ("GET", "/API/v1/queues/<queue_name>/schedules", "schedules", "schedules.schedules"),
    ("GET", _ONE, "schedule", "schedules.schedule"),
    ("DELETE", _ONE, "delete-schedule", "schedules.delete_schedule"),
    ("POST", f"{_ONE}/pause", "pause-schedule", "schedules.pause_schedule"),
    ("POST", f"{_ONE}/resume", "resume-schedule", "schedules.resume_schedule"),
]
