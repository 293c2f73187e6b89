"""The REST API's operator controls (L5): purge, pause and resume a queue or a
group, list a queue's groups and its consumers. Held by :class:`doq_lib.http.api.Api` as
``controls``."""
from __future__ import annotations

import time
from typing import Any

from doq_lib import rules
from doq_lib.fsm.consumers import ConsumerView
from doq_lib.fsm.inspect import BROWSE_STATES, Listed
from doq_lib.http.calls import CURRENT_CALL, ClientWatch, HttpProblem, reply
from doq_lib.http.parsing import decimal_of, json_body, path_id
from doq_lib.models import GroupInfo
from doq_lib.service import Service

BROWSE_LIMIT = 100                 # messages of a browse page unless ?limit= says otherwise


def group_out(g: GroupInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"group": g.group, "ready": g.ready, "unacked": g.unacked,
                           "paused": g.paused_by is not None}
    if g.paused_by is not None and g.paused_by != g.group:
        out["paused_by"] = g.paused_by                 # a parent group's pause covers it
    return out


def _check_group(group: str, location: str) -> str:
    message = rules.group_message(group, "http") if group else "expected length >= 1"
    if message is not None:
        raise _invalid(message, location, group)
    return group


def _path_group(group: str) -> str:
    return _check_group(group, "path.group")


def _invalid(message: str, location: str, value: Any) -> HttpProblem:
    return HttpProblem(422, "validation failed", [
        {"message": message, "location": location, "value": value}])


def consumer_out(view: ConsumerView, now_ms: int) -> dict[str, Any]:
    return {"name": view.name, "held": view.held, "messages": [str(m) for m in view.messages],
            "oldest_lease_ms": max(0, now_ms - view.oldest_since) if view.held else 0,
            "last_seen": view.last_seen, "deliveries": view.deliveries, "acks": view.acks,
            "nacks": view.nacks}


def listed_out(row: Listed, message_out: Any) -> dict[str, Any]:
    out: dict[str, Any] = message_out("BROWSED", row.message, True)
    del out["status"]
    out["state"] = row.state
    if row.deadline:
        out["deadline"] = row.deadline
    if row.state == "unacked":
        out["delivered_at"] = row.since            # 0: delivered before the time was kept
        if row.consumer:
            out["consumer"] = row.consumer
    return out


class ControlsApi:
    """The operator routes' handlers (``api.controls``)."""

    def __init__(self, service: Service) -> None:
        self.svc = service

    def browse(self, queue_name: str, message_out: Any) -> bytes:
        """GET .../messages?browse=true: a page of messages, nothing taken."""
        query = CURRENT_CALL.get().query
        raw = query("state")
        state = "all" if raw is None else raw
        if state not in BROWSE_STATES:
            raise _invalid(f"expected one of {', '.join(BROWSE_STATES)}", "query.state", state)
        raw = query("limit")
        limit = BROWSE_LIMIT if raw is None else decimal_of(raw)
        if limit is None or not 1 <= limit <= rules.MAX_BROWSE:
            raise _invalid(f"expected an integer from 1 to {rules.MAX_BROWSE}", "query.limit",
                           raw)
        raw = query("after")
        after = None
        if raw is not None:
            after = decimal_of(raw)
            if not after or after >= 2 ** 64:
                raise _invalid("expected a message id (decimal)", "query.after", raw)
        group = query("group")
        if group is not None:
            _check_group(group, "query.group")
        with ClientWatch(CURRENT_CALL.get().environ) as gone:
            rows, more = self.svc.browse(queue_name, state, group, after, limit,
                                         cancelled=gone.is_set)
        return reply(200, {"messages": [listed_out(r, message_out) for r in rows],
                            "next": None if more is None else str(more)})

    def explain(self, queue_name: str, id: str) -> bytes:
        mid = path_id(id)
        with ClientWatch(CURRENT_CALL.get().environ) as gone:
            found = self.svc.explain(queue_name, mid, cancelled=gone.is_set)
        out: dict[str, Any] = {"id": str(mid), "state": found.state, "reasons": found.reasons,
                               "ahead": found.ahead}
        if found.state == "unacked":
            out["held_by"] = {"consumer": found.held_by, "since": found.held_since}
        return reply(200, out)

    def consumers(self, queue_name: str) -> bytes:
        """The consumers the queue knows: what each holds and did."""
        now_ms = int(time.time() * 1000)
        return reply(200, {"consumers": [consumer_out(c, now_ms)
                                          for c in self.svc.consumers(queue_name)]})

    def purge(self, queue_name: str) -> bytes:
        """Drop every waiting message (and, with include_unacked, every delivered one)."""
        body = json_body("PurgeInputBody", required=False)
        purged = self.svc.purge(queue_name, body.get("include_unacked", False))
        return reply(200, {"status": "PURGED", "purged": purged})

    def pause(self, queue_name: str) -> bytes:
        self.svc.set_paused(queue_name, True)
        return reply(200, {"status": "PAUSED"})

    def resume(self, queue_name: str) -> bytes:
        self.svc.set_paused(queue_name, False)
        return reply(200, {"status": "RESUMED"})

    def pause_group(self, queue_name: str, group: str) -> bytes:
        self.svc.set_paused(queue_name, True, _path_group(group))
        return reply(200, {"status": "PAUSED", "group": group})

    def resume_group(self, queue_name: str, group: str) -> bytes:
        self.svc.set_paused(queue_name, False, _path_group(group))
        return reply(200, {"status": "RESUMED", "group": group})

    def groups(self, queue_name: str) -> bytes:
        return reply(200, {"groups": [group_out(g) for g in self.svc.groups(queue_name)]})


ROUTES: list[tuple[str, str, str, str]] = [     # method, path, op id, handler
    ("POST", "/API/v1/queues/<queue_name>/purge", "purge", "controls.purge"),
    ("POST", "/API/v1/queues/<queue_name>/pause", "pause", "controls.pause"),
    ("POST", "/API/v1/queues/<queue_name>/resume", "resume", "controls.resume"),
    ("GET", "/API/v1/queues/<queue_name>/groups", "groups", "controls.groups"),
    ("GET", "/API/v1/queues/<queue_name>/consumers", "consumers", "controls.consumers"),
    ("GET", "/API/v1/queues/<queue_name>/messages/<id>/explain", "explain", "controls.explain"),
    ("POST", "/API/v1/queues/<queue_name>/groups/<group:re:[\\s\\S]+>/pause", "pause-group",
     "controls.pause_group"),
    ("POST", "/API/v1/queues/<queue_name>/groups/<group:re:[\\s\\S]+>/resume", "resume-group",
     "controls.resume_group"),
]
