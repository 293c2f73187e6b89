"""Schedules in the clients: create or replace, list, delete, pause and resume the schedules
of a queue, the same calls over HTTP (:class:`HttpSchedules`) and gRPC (:class:`GrpcSchedules`).
The clients inherit them."""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule: its definition (``cron`` in ``timezone``, or ``every`` seconds), the
    message it stores at each occurrence, and what it did. Times are unix seconds (0: none;
    ``next_at`` 0: it has ended). ``status``: what a put did (created, replaced, unchanged;
    "" in listings)."""

    name: str
    cron: str
    every: int
    timezone: str
    content: str
    priority: int = 0
    group: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    ttl: int = 0
    start_at: int = 0
    end_at: int = 0
    catch_up: str = "one"
    grace: int = 60
    paused: bool = False
    next_at: int = 0
    last_fired: int = 0
    fired: int = 0
    skipped: int = 0
    refused: int = 0
    last_error: str = ""
    created_at: int = 0
    status: str = ""


def _definition(name: str, content: str, cron: str | None, every: int | None,
                timezone: str | None, priority: int, group: str,
                metadata: dict[str, str] | None, ttl: int, start_at: int | None,
                end_at: int | None, catch_up: str | None, grace: int | None) -> dict[str, Any]:
    """The schedule as the REST API takes it (what is not given is left out)."""
    message: dict[str, Any] = {"content": content}
    for key, value in (("priority", priority), ("group", group), ("metadata", metadata),
                       ("ttl", ttl)):
        if value:
            message[key] = value
    out: dict[str, Any] = {"name": name, "message": message}
    for key, value in (("cron", cron), ("every", every), ("timezone", timezone),
                       ("start_at", start_at), ("end_at", end_at), ("catch_up", catch_up),
                       ("grace", grace)):
        if value is not None:
            out[key] = value
    return out


def _from_rest(out: dict[str, Any], status: str = "") -> ScheduleInfo:
    message = out["message"]
    return ScheduleInfo(out["name"], out.get("cron", ""), out.get("every", 0),
                        out.get("timezone", ""), message["content"],
                        message.get("priority", 0), message.get("group", ""),
                        message.get("metadata") or {}, message.get("ttl", 0),
                        out.get("start_at", 0), out.get("end_at", 0), out["catch_up"],
                        out["grace"], out["paused"], out["next_at"] or 0,
                        out["last_fired"] or 0, out["fired"], out["skipped"], out["refused"],
                        out["last_error"] or "", out["created_at"] or 0, status)


def _from_rpc(info: Any, status: str = "") -> ScheduleInfo:
    d, m = info.schedule, info.schedule.message
    return ScheduleInfo(d.name, d.cron, d.every, d.timezone, m.content, m.priority, m.group,
                        dict(m.metadata), m.ttl, d.start_at, d.end_at, d.catch_up, d.grace,
                        info.paused, info.next_at, info.last_fired, info.fired, info.skipped,
                        info.refused, info.last_error, info.created_at, status)


def _path(queue: str, name: str = "", tail: str = "") -> str:
    base = "/API/v1/queues/" + urllib.parse.quote(queue, safe="") + "/schedules"
    return base + ("/" + urllib.parse.quote(name, safe="") if name else "") + tail


class HttpSchedules:
    """The schedule calls of the HTTP client."""

    def _request(self, method: str, path: str, body: Any = None, safe: bool = False,
                 extra_time: float = 0.0) -> Any:
        raise NotImplementedError                          # HttpClient's

    def put_schedule(self, queue: str, name: str, content: str, *, cron: str | None = None,
                     every: int | None = None, timezone: str | None = None,
                     priority: int = 0, group: str = "", metadata: dict[str, str] | None = None,
                     ttl: int = 0, start_at: int | None = None, end_at: int | None = None,
                     catch_up: str | None = None, grace: int | None = None,
                     paused: bool = False) -> ScheduleInfo:
        """Create schedule ``name`` of ``queue`` (``cron`` or ``every`` seconds), or replace
        its definition; it stores a message with ``content`` at each occurrence."""
        body = _definition(name, content, cron, every, timezone, priority, group, metadata,
                           ttl, start_at, end_at, catch_up, grace)
        if paused:
            body["paused"] = True
        out = self._request("POST", _path(queue), body)
        return _from_rest(out["schedule"], out["status"].lower())

    def schedules(self, queue: str) -> list[ScheduleInfo]:
        return [_from_rest(s) for s in self._request("GET", _path(queue),
                                                      safe=True)["schedules"]]

    def schedule(self, queue: str, name: str) -> ScheduleInfo:
        return _from_rest(self._request("GET", _path(queue, name), safe=True))

    def delete_schedule(self, queue: str, name: str) -> None:
        self._request("DELETE", _path(queue, name))

    def pause_schedule(self, queue: str, name: str) -> bool:
        """Whether it was running (and is paused now)."""
        return bool(self._request("POST", _path(queue, name, "/pause"), {})["changed"])

    def resume_schedule(self, queue: str, name: str) -> bool:
        return bool(self._request("POST", _path(queue, name, "/resume"), {})["changed"])


class GrpcSchedules:
    """The schedule calls of the gRPC client."""

    _pb: Any

    def _call(self, rpc: str, request: Any, safe: bool = False) -> Any:
        raise NotImplementedError                          # GrpcClient's

    def put_schedule(self, queue: str, name: str, content: str, *, cron: str | None = None,
                     every: int | None = None, timezone: str | None = None,
                     priority: int = 0, group: str = "", metadata: dict[str, str] | None = None,
                     ttl: int = 0, start_at: int | None = None, end_at: int | None = None,
                     catch_up: str | None = None, grace: int | None = None,
                     paused: bool = False) -> ScheduleInfo:
        """As :meth:`HttpSchedules.put_schedule`."""
        given = _definition(name, content, cron, every, timezone, priority, group, metadata,
                            ttl, start_at, end_at, catch_up, grace)
        pb = self._pb
        given["message"] = pb.ScheduleMessage(**given["message"])
        request = pb.PutScheduleRequest(queueName=queue, paused=paused,
                                        schedule=pb.ScheduleDefinition(**given))
        out = self._call("PutSchedule", request)
        return _from_rpc(out.schedule, out.status.lower())

    def schedules(self, queue: str) -> list[ScheduleInfo]:
        out = self._call("GetSchedules", self._pb.GetSchedulesRequest(queueName=queue),
                         safe=True)
        return [_from_rpc(s) for s in out.schedules]

    def schedule(self, queue: str, name: str) -> ScheduleInfo:
        out = self._call("GetSchedules", self._pb.GetSchedulesRequest(queueName=queue,
                                                                     name=name), safe=True)
        return _from_rpc(out.schedules[0])

    def delete_schedule(self, queue: str, name: str) -> None:
        self._call("DeleteSchedule", self._pb.ScheduleRequest(queueName=queue, name=name))

    def pause_schedule(self, queue: str, name: str) -> bool:
        return bool(self._call("PauseSchedule", self._pb.ScheduleRequest(
            queueName=queue, name=name)).changed)

    def resume_schedule(self, queue: str, name: str) -> bool:
        return bool(self._call("ResumeSchedule", self._pb.ScheduleRequest(
            queueName=queue, name=name)).changed)
