"""What the REST API tests check answers with: the expected shapes (problem bodies, message keys,
security headers), request helpers, and the victim queue that rejected requests aim at."""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from http.client import HTTPConnection
from typing import Any

from tests.harness import Http, Response

MIB = 1 << 20
INT64_MAX = 2 ** 63 - 1
DECIMAL_ID = re.compile(r"[1-9][0-9]*")
TITLES = {400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
          413: "Request Entity Too Large", 415: "Unsupported Media Type",
          422: "Unprocessable Entity", 500: "Internal Server Error",
          503: "Service Unavailable"}
SECURITY_HEADERS = {
    "x-xss-protection": "0", "x-content-type-options": "nosniff",
    "x-frame-options": "SAMEORIGIN", "referrer-policy": "no-referrer",
    "cross-origin-embedder-policy": "require-corp", "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin", "origin-agent-cluster": "?1",
    "x-dns-prefetch-control": "off", "x-download-options": "noopen",
    "x-permitted-cross-domain-policies": "none",
}
MESSAGE_KEYS = {"status", "id", "group", "priority", "content", "metadata"}
INFO_KEYS = {"name", "type", "settings", "enqueue_rps", "dequeue_rps", "ack_rps", "nack_rps",
             "ready", "unacked", "total"}
TRUE_SPELLINGS = ["1", "t", "T", "TRUE", "true", "True"]
FALSE_SPELLINGS = ["0", "f", "F", "FALSE", "false", "False"]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- helpers -------------------------------------------------------------------------------------
def _reject_constant(text: str) -> None:
    raise AssertionError(f"the server sent {text}, which is not JSON")


def strict_json(resp: Response) -> Any:
    return json.loads(resp.body, parse_constant=_reject_constant)


def ok(resp: Response, status: int = 200) -> Any:
    assert resp.status == status, (resp.status, resp.body[:500])
    assert resp.headers["content-type"].split(";")[0] == "application/json"
    return strict_json(resp)


def problem(resp: Response, status: int, detail: str) -> dict[str, Any]:
    assert resp.status == status, (resp.status, resp.body[:500])
    assert resp.headers["content-type"].split(";")[0] == "application/problem+json"
    body = strict_json(resp)
    assert body["title"] == TITLES[status] and body["status"] == status, body
    assert body["detail"] == detail, body
    return body  # type: ignore[no-any-return]


def business(resp: Response, status: int, detail: str, message: str) -> None:
    """A business error: exactly one cause, carrying only ``message`` (SPEC §3.1)."""
    assert problem(resp, status, detail)["errors"] == [{"message": message}]


def invalid(resp: Response, message: str, location: str, status: int = 422,
            **value: Any) -> dict[str, Any]:
    """A validation error with exactly one cause at ``location`` (and ``value`` if given)."""
    body = problem(resp, status, "validation failed")
    errors = body["errors"]
    assert [(e["message"], e["location"]) for e in errors] == [(message, location)], errors
    if value:
        assert errors[0]["value"] == value["value"], errors
    return body


def create(http: Http, name: str, qtype: str = "delayed",
           settings: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "type": qtype}
    if settings is not None:
        body["settings"] = settings
    out = ok(http.post("/API/v1/queues", body))
    assert out["status"] == "CREATED"
    return out  # type: ignore[no-any-return]


def enqueue(http: Http, queue: str, priority: int = 10, content: str = "x",
            **extra: Any) -> dict[str, Any]:
    out = ok(http.post(f"/API/v1/queues/{queue}/messages",
                       {"priority": priority, "content": content, **extra}))
    assert out["status"] == "ENQUEUED" and DECIMAL_ID.fullmatch(out["id"]), out
    return out  # type: ignore[no-any-return]


def dequeue(http: Http, queue: str, ack: bool = False) -> dict[str, Any]:
    out = ok(http.get(f"/API/v1/queues/{queue}/messages?ack={'true' if ack else 'false'}"))
    assert out["status"] == "DEQUEUED" and DECIMAL_ID.fullmatch(out["id"]), out
    return out  # type: ignore[no-any-return]


def assert_empty(http: Http, queue: str, ack: bool = False) -> None:
    business(http.get(f"/API/v1/queues/{queue}/messages?ack={'true' if ack else 'false'}"), 400,
             "Failed to dequeue a message from a queue", f"Queue is empty: {queue}")


def info(http: Http, queue: str) -> dict[str, Any]:
    return ok(http.get(f"/API/v1/queues/{queue}"))  # type: ignore[no-any-return]


def counts(http: Http, queue: str) -> tuple[int, int, int]:
    i = info(http, queue)
    return i["ready"], i["unacked"], i["total"]


def get_message(http: Http, queue: str, mid: str) -> dict[str, Any]:
    out = ok(http.get(f"/API/v1/queues/{queue}/messages/{mid}"))
    assert out["status"] == "GOT"
    return out  # type: ignore[no-any-return]


def assert_no_queue(http: Http, queue: str) -> None:
    business(http.get(f"/API/v1/queues/{queue}"), 400, "Failed to get stats for a queue",
             "queue not found")


def snapshot(http: Http, queue: str, ids: list[str]) -> dict[str, Any]:
    """Everything observable about a queue except its (time-dependent) rates."""
    i = info(http, queue)
    state: dict[str, Any] = {k: i[k] for k in ("type", "settings", "ready", "unacked", "total")}
    for mid in ids:
        resp = http.get(f"/API/v1/queues/{queue}/messages/{mid}")
        state[mid] = (resp.status, resp.json())
    return state


def send_chunked(port: int, method: str, path: str, chunks: list[bytes],
                 content_type: str = "application/json") -> Response:
    conn = HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request(method, path, body=iter(chunks), encode_chunked=True,
                     headers={"Content-Type": content_type, "Transfer-Encoding": "chunked"})
        resp = conn.getresponse()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


@dataclass
class Victim:
    """A queue every rejected request is aimed at: one ready and one unacked message."""

    queue: str
    ready: str
    unacked: str
    new: str            # a queue name that must never come into existence

    def fill(self, template: str) -> str:
        return template.format(q=self.queue, r=self.ready, u=self.unacked, new=self.new)

    def state(self, http: Http) -> dict[str, Any]:
        return snapshot(http, self.queue, [self.ready, self.unacked])


def rejected(http: Http, victim: Victim, method: str, path: str, **kw: Any) -> Response:
    """Send a request that must be rejected, and check it changed nothing."""
    before = victim.state(http)
    resp = http.request(method, victim.fill(path), **kw)
    assert victim.state(http) == before
    assert_no_queue(http, victim.new)
    return resp


def fill_body(victim: Victim, body: Any) -> Any:
    """``body`` with the placeholder ``{new}`` replaced by the never-created queue name."""
    if isinstance(body, dict):
        return {k: fill_body(victim, v) for k, v in body.items()}
    if isinstance(body, str) and body == "{new}":
        return victim.new
    return body
