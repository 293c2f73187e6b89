"""The REST API's operator controls (issue 18, L5): purge, pause and resume a queue or a
group, list a queue's groups. A mixin of :class:`doq_lib.http.api.Api`."""
from __future__ import annotations

from typing import Any

from doq_lib import rules
from doq_lib.http.calls import HttpProblem, _reply
from doq_lib.http.parsing import json_body
from doq_lib.models import GroupInfo
from doq_lib.service import Service


def group_out(g: GroupInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"group": g.group, "ready": g.ready, "unacked": g.unacked,
                           "paused": g.paused_by is not None}
    if g.paused_by is not None and g.paused_by != g.group:
        out["paused_by"] = g.paused_by                 # a parent group's pause covers it
    return out


def _path_group(group: str) -> str:
    message = rules.group_message(group, "http")
    if message is not None:
        raise HttpProblem(422, "validation failed", [
            {"message": message, "location": "path.group", "value": group}])
    return group


class ControlsApi:
    svc: Service

    def purge(self, queue_name: str) -> bytes:
        """Drop every waiting message (and, with include_unacked, every delivered one)."""
        body = json_body("PurgeInputBody", required=False)
        purged = self.svc.purge(queue_name, body.get("include_unacked", False))
        return _reply(200, {"status": "PURGED", "purged": purged})

    def pause(self, queue_name: str) -> bytes:
        self.svc.set_paused(queue_name, True)
        return _reply(200, {"status": "PAUSED"})

    def resume(self, queue_name: str) -> bytes:
        self.svc.set_paused(queue_name, False)
        return _reply(200, {"status": "RESUMED"})

    def pause_group(self, queue_name: str, group: str) -> bytes:
        self.svc.set_paused(queue_name, True, _path_group(group))
        return _reply(200, {"status": "PAUSED", "group": group})

    def resume_group(self, queue_name: str, group: str) -> bytes:
        self.svc.set_paused(queue_name, False, _path_group(group))
        return _reply(200, {"status": "RESUMED", "group": group})

    def groups(self, queue_name: str) -> bytes:
        return _reply(200, {"groups": [group_out(g) for g in self.svc.groups(queue_name)]})


ROUTES: list[tuple[str, str, str, str]] = [     # method, path, op id, handler
    ("POST", "/API/v1/queues/<queue_name>/purge", "purge", "purge"),
    ("POST", "/API/v1/queues/<queue_name>/pause", "pause", "pause"),
    ("POST", "/API/v1/queues/<queue_name>/resume", "resume", "resume"),
    ("GET", "/API/v1/queues/<queue_name>/groups", "groups", "groups"),
    ("POST", "/API/v1/queues/<queue_name>/groups/<group:path>/pause", "pause-group",
     "pause_group"),
    ("POST", "/API/v1/queues/<queue_name>/groups/<group:path>/resume", "resume-group",
     "resume_group"),
]
