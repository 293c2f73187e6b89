"""Schedules in the clients: :class:`ScheduleInfo`, and a schedule's definition and state as
the REST API and the gRPC API carry them (the calls are in ``http_calls`` and ``rpc_calls``)."""
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


def definition(name: str, content: str, cron: str | None, every: int | None,
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


def schedule_from_rest(out: dict[str, Any], status: str = "") -> ScheduleInfo:
    message = out["message"]
    return ScheduleInfo(out["name"], out.get("cron", ""), out.get("every", 0),
                        out.get("timezone", ""), message["content"],
                        message.get("priority", 0), message.get("group", ""),
                        message.get("metadata") or {}, message.get("ttl", 0),
                        out.get("start_at", 0), out.get("end_at", 0), out["catch_up"],
                        out["grace"], out["paused"], out["next_at"] or 0,
                        out["last_fired"] or 0, out["fired"], out["skipped"], out["refused"],
                        out["last_error"] or "", out["created_at"] or 0, status)


def schedule_from_rpc(info: Any, status: str = "") -> ScheduleInfo:
    d, m = info.schedule, info.schedule.message
    return ScheduleInfo(d.name, d.cron, d.every, d.timezone, m.content, m.priority, m.group,
                        dict(m.metadata), m.ttl, d.start_at, d.end_at, d.catch_up, d.grace,
                        info.paused, info.next_at, info.last_fired, info.fired, info.skipped,
                        info.refused, info.last_error, info.created_at, status)


def schedule_path(queue: str, name: str = "", tail: str = "") -> str:
    base = "/API/v1/queues/" + urllib.parse.quote(queue, safe="") + "/schedules"
    return base + ("/" + urllib.parse.quote(name, safe="") if name else "") + tail
