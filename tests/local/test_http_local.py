"""The HTTP API in process: the WSGI application a node serves (doq_lib.http.Middleware
over build_app), over the service over the in-memory proposer. Every route of the API, its
answers and failures, without sockets or subprocesses (the server and the wire: the
real-node tests)."""
from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest

from doq_lib import commands as C
from doq_lib.cluster import Membership
from doq_lib.http import ROUTES, Middleware, build_app
from doq_lib.raft import wire
from tests.conftest import FixedClock, LocalNode
from tests.harness import REPO, free_ports


class OneMemberNode:
    """What Membership reads of a Raft node, for a cluster of one member that leads."""

    def __init__(self, address: str) -> None:
        self.leader_address = address
        self.is_leader = True
        self.otherNodes: list[Any] = []
        self.doq_wire_security = wire.WireSecurity(None)

    def member_addresses(self) -> set[str]:
        return {self.leader_address}

    def follower_lags(self) -> dict[str, int]:
        return {}

    def connected_peers(self) -> dict[str, bool]:
        return {}

    def last_response(self, addr: str) -> float | None:
        return None


class Answer:
    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = int(status[:3])
        self.headers = {k.lower(): v for k, v in headers}
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Api:
    """Calls the WSGI application as a server would, noting each route that answered."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.routes: set[str] = set()

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
             content_type: str = "application/json") -> Answer:
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        target, _, query = path.partition("?")
        environ = {"REQUEST_METHOD": method, "PATH_INFO": target, "QUERY_STRING": query,
                   "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000",
                   "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
                   "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(data),
                   "CONTENT_LENGTH": str(len(data))}
        if data:
            environ["CONTENT_TYPE"] = content_type
        answered: list[Any] = []
        chunks = self.app(environ, lambda status, headers, exc=None: answered.append(
            (status, list(headers))))
        payload = b"".join(chunks)
        route = environ.get("bottle.route")
        if route is not None and route.name:
            self.routes.add(route.name)
        return Answer(answered[0][0], answered[0][1], payload)


@pytest.fixture
def api(local: LocalNode) -> Api:
    membership = Membership(local.cfg, OneMemberNode(local.cfg.raft.address),  # type: ignore[arg-type]
                            local.fsm, local.service, local.service.http_addr)
    app = build_app(local.service, membership, None, os.path.join(REPO, "webui"))
    return Api(Middleware(app, local.service, None))


def ok(answer: Answer, status: int = 200) -> Any:
    assert answer.status == status, (answer.status, answer.body[:300])
    return answer.json() if answer.body else None


def queues(api: Api) -> None:
    ok(api.call("POST", "/API/v1/queues", {"name": "d", "type": "delayed"}))
    ok(api.call("POST", "/API/v1/queues", {"name": "f", "type": "fair",
                                            "settings": {"strategy": "weighted"}}))
    out = ok(api.call("PUT", "/API/v1/queues/f", {"settings": {"max_unacked": 2,
                                                               "ack_timeout": 90}}))
    assert out["settings"] == {"max_unacked": 2, "ack_timeout": 90}
    assert ok(api.call("GET", "/API/v1/queues/f"))["settings"]["ack_timeout"] == 90
    assert [q["name"] for q in ok(api.call("GET", "/API/v1/queues"))["queues"]] == ["d", "f"]
    ok(api.call("DELETE", "/API/v1/queues/f"))
    missing = api.call("GET", "/API/v1/queues/f")
    assert (missing.status, missing.json()["detail"]) == (400, "Failed to get stats for a queue")
    bad = api.call("POST", "/API/v1/queues", {"name": "x", "type": "delayed",
                                               "settings": {"ack_timeout": 59}})
    assert bad.status == 422 and bad.json()["errors"][0]["location"] == "body.settings.ack_timeout"
    assert len(ok(api.call("POST", "/API/v1/ids", {"number": 3}))["ids"]) == 3


def messages(api: Api) -> None:
    ok(api.call("POST", "/API/v1/queues", {"name": "q", "type": "delayed"}))
    base = "/API/v1/queues/q/messages"
    first = ok(api.call("POST", base, {"content": "a", "priority": 5, "metadata": {"k": "v"}}))
    ids = ok(api.call("POST", f"{base}/batch", {"messages": [
        {"content": f"b{p}", "priority": p} for p in (6, 7)]}))["ids"]
    assert ok(api.call("GET", f"{base}/{first['id']}"))["metadata"] == {"k": "v"}
    ok(api.call("PUT", f"{base}/{ids[1]}/priority", {"priority": 1}))
    taken = ok(api.call("GET", f"{base}?ack=false"))
    assert taken["content"] == "b7"
    ok(api.call("POST", f"{base}/{taken['id']}/touch"))
    ok(api.call("POST", f"{base}/{taken['id']}/nack", {"priority": 9}))
    again = ok(api.call("GET", f"{base}?ack=false"))
    ok(api.call("POST", f"{base}/{again['id']}/ack"))
    ok(api.call("DELETE", f"{base}/{ids[0]}"), 204)
    late = api.call("POST", f"{base}/{again['id']}/ack")
    assert (late.status, late.json()["detail"]) == (400, "Failed to ack a message from a queue")
    ok(api.call("POST", f"{base}/batch", {"messages": [
        {"content": f"c{n}", "priority": 20 + n} for n in range(3)]}))
    several = ok(api.call("GET", f"{base}?ack=false&count=5"))["messages"]
    assert len(several) == 4
    out = ok(api.call("POST", f"{base}/ack", {"ids": [several[0]["id"], "12345"]}))
    assert out["acked"] == [several[0]["id"]] and out["failed"][0]["id"] == "12345"
    out = ok(api.call("POST", f"{base}/nack", {"ids": [m["id"] for m in several[1:]]}))
    assert len(out["nacked"]) == len(several) - 1
    empty = api.call("POST", "/API/v1/queues/nope/messages", {"content": "x", "priority": 1})
    assert (empty.status, empty.json()["code"]) == (409, "queue_not_found")


def dead_letters(api: Api) -> None:
    """Delivery counts, last errors, max_deliveries, the dead-letter queue and reject."""
    ok(api.call("POST", "/API/v1/queues", {"name": "dlq", "type": "delayed"}))
    made = ok(api.call("POST", "/API/v1/queues", {"name": "work", "type": "fair", "settings": {
        "max_deliveries": 2, "dead_letter_queue": "dlq"}}))
    assert made["settings"] == {"max_deliveries": 2, "dead_letter_queue": "dlq"}
    info = ok(api.call("GET", "/API/v1/queues/work"))["settings"]
    assert (info["max_deliveries"], info["dead_letter_queue"]) == (2, "dlq")
    base = "/API/v1/queues/work/messages"
    mid = ok(api.call("POST", base, {"content": "job", "priority": 3, "group": "g"}))["id"]
    first = ok(api.call("GET", f"{base}?ack=false"))
    assert (first["id"], first["deliveries"]) == (mid, 1) and "last_error" not in first
    nacked = ok(api.call("POST", f"{base}/{mid}/nack", {"priority": 0, "error": "timeout"}))
    assert "dead_lettered" not in nacked
    got = ok(api.call("GET", f"{base}/{mid}"))
    assert (got["deliveries"], got["last_error"]) == (1, "timeout")
    assert ok(api.call("GET", f"{base}?ack=false"))["deliveries"] == 2
    assert ok(api.call("POST", f"{base}/{mid}/nack", {"priority": 0}))["dead_lettered"]
    dead = ok(api.call("GET", "/API/v1/queues/dlq/messages?ack=true"))
    assert dead["content"] == "job" and dead["priority"] == 0 and dead["deliveries"] == 1
    assert {k: v for k, v in dead["metadata"].items() if k != "x-dead-at"} == {
        "x-dead-reason": "max_deliveries", "x-dead-from": "work", "x-deliveries": "2",
        "x-last-error": "timeout"}
    other = ok(api.call("POST", base, {"content": "x", "priority": 1, "group": "g"}))["id"]
    ok(api.call("GET", f"{base}?ack=false"))
    assert ok(api.call("POST", f"{base}/{other}/reject", {"error": "poison"})) == {
        "status": "REJECTED", "id": other}
    assert ok(api.call("GET", "/API/v1/queues/dlq/messages?ack=true"))["metadata"][
        "x-dead-reason"] == "rejected"
    late = api.call("POST", f"{base}/{other}/reject")
    assert (late.status, late.json()["detail"]) == (400, "Failed to reject a message from a "
                                                         "queue")
    # refusals: 422 naming the setting, 409 for a queue still in use; nothing changed
    for settings, said in (({"dead_letter_queue": "nope"}, "does not exist"),
                           ({"dead_letter_queue": "c"}, "its own"),
                           ({"max_deliveries": -1}, "expected number >= 0")):
        bad = api.call("POST", "/API/v1/queues", {"name": "c", "type": "delayed",
                                                   "settings": settings})
        assert bad.status == 422 and said in bad.body.decode(), bad.body
    cycle = api.call("PUT", "/API/v1/queues/dlq", {"settings": {"dead_letter_queue": "work"}})
    assert cycle.status == 422 and "cycle (dlq -> work -> dlq)" in cycle.json()["detail"]
    busy = api.call("DELETE", "/API/v1/queues/dlq")
    assert (busy.status, busy.json()["code"]) == (409, "queue_in_use"), busy.body
    long_error = api.call("POST", f"{base}/{mid}/nack", {"priority": 0, "error": "e" * 5000})
    assert long_error.status == 422 and long_error.json()["errors"][0]["location"] == \
        "body.error"
    ok(api.call("PUT", "/API/v1/queues/work", {"settings": {"ack_timeout": 90}}))
    kept = ok(api.call("GET", "/API/v1/queues/work"))["settings"]
    assert (kept["max_deliveries"], kept["dead_letter_queue"]) == (2, "dlq")
    # redrive: the rejected message back to work; refusals name the field
    ok(api.call("POST", base, {"content": "y", "priority": 1, "group": "g"}))
    taken = ok(api.call("GET", f"{base}?ack=false"))["id"]
    ok(api.call("POST", f"{base}/{taken}/reject"))
    out = ok(api.call("POST", "/API/v1/queues/dlq/redrive", {"ids": [taken, "99"]}))
    assert out == {"moved": 1, "failed": [{"id": "99", "code": "message_not_found",
                                           "detail": "no message 99 in queue 'dlq'"}]}
    assert ok(api.call("GET", f"{base}/{taken}"))["deliveries"] == 0
    for body, status, where in (({"ids": ["1"], "count": 2}, 422, "give ids or count"),
                                ({"to": "ghost"}, 422, "to: queue 'ghost' does not exist"),
                                ({"count": 0}, 422, "expected number >= 1")):
        bad = api.call("POST", "/API/v1/queues/dlq/redrive", body)
        assert bad.status == status and where in bad.body.decode(), bad.body
    assert ok(api.call("POST", "/API/v1/queues/dlq/redrive")) == {"moved": 0, "failed": []}
    # max_messages: 429 with the reason, nothing stored; drop_oldest dead-letters
    ok(api.call("POST", "/API/v1/queues", {"name": "cap", "type": "delayed", "settings": {
        "max_messages": 1}}))
    ok(api.call("POST", "/API/v1/queues/cap/messages", {"content": "a", "priority": 1}))
    full = api.call("POST", "/API/v1/queues/cap/messages", {"content": "b", "priority": 1})
    assert (full.status, full.json()["code"], full.json()["detail"]) == (
        429, "queue_full", "queue is full: cap"), full.body
    ok(api.call("PUT", "/API/v1/queues/cap", {"settings": {"overflow": "drop_oldest",
                                                           "dead_letter_queue": "dlq"}}))
    ok(api.call("POST", "/API/v1/queues/cap/messages", {"content": "b", "priority": 1}))
    assert ok(api.call("GET", "/API/v1/queues/dlq/messages?ack=true"))["metadata"][
        "x-dead-reason"] == "overflow"
    # a full dead-letter queue that refuses more: each message stays where it was
    ok(api.call("PUT", "/API/v1/queues/dlq", {"settings": {"max_messages": 1}}))
    ok(api.call("POST", "/API/v1/queues/dlq/messages", {"content": "fills it", "priority": 1}))
    ok(api.call("POST", "/API/v1/queues", {"name": "w2", "type": "delayed", "settings": {
        "max_deliveries": 2, "dead_letter_queue": "dlq"}}))
    base = "/API/v1/queues/w2/messages"
    kept = ok(api.call("POST", base, {"content": "z", "priority": 1}))["id"]
    assert ok(api.call("GET", f"{base}?ack=false"))["id"] == kept
    refused = api.call("POST", f"{base}/{kept}/reject", {"error": "bad"})
    assert (refused.status, refused.json()["code"]) == (429, "queue_full"), refused.body
    assert "dead-letter queue 'dlq' is full" in refused.json()["errors"][0]["message"]
    ok(api.call("POST", f"{base}/{kept}/nack", {"priority": 0}))
    ok(api.call("GET", f"{base}?ack=false"))                    # its last delivery
    nacked = ok(api.call("POST", f"{base}/{kept}/nack", {"priority": 0}))
    assert "dead_lettered" not in nacked and "'dlq' is full" in nacked["dead_letter_refused"]
    assert ok(api.call("GET", f"{base}/{kept}"))["deliveries"] == 2
    # the server's own metadata keys are refused on input
    forged = api.call("POST", base, {"content": "f", "priority": 1,
                                     "metadata": {"x-dead-from": "dlq"}})
    assert forged.status == 422 and "body.metadata" in forged.body.decode(), forged.body
    ok(api.call("DELETE", "/API/v1/queues/w2"))
    bad = api.call("PUT", "/API/v1/queues/cap", {"settings": {"overflow": "drop_newest"}})
    assert bad.status == 422 and bad.json()["errors"][0]["location"] == "body.settings.overflow"
    # the dedup window: the first message's id, duplicate: true, nothing stored
    ok(api.call("POST", "/API/v1/queues", {"name": "once", "type": "delayed", "settings": {
        "dedup_window": 600}}))
    assert ok(api.call("GET", "/API/v1/queues/once"))["settings"]["dedup_window"] == 600
    first = ok(api.call("POST", "/API/v1/queues/once/messages", {
        "content": "a", "priority": 1, "dedup_key": "order-1"}))
    assert "duplicate" not in first
    again = ok(api.call("POST", "/API/v1/queues/once/messages", {
        "content": "b", "priority": 1, "dedup_key": "order-1"}))
    assert (again["id"], again["duplicate"]) == (first["id"], True)
    assert ok(api.call("GET", "/API/v1/queues/once"))["total"] == 1
    bad = api.call("POST", "/API/v1/queues/once/messages", {
        "content": "c", "priority": 1, "dedup_key": "k" * 257})
    assert bad.status == 422 and bad.json()["errors"][0]["location"] == "body.dedup_key"
    # a nack's delay and the back-off settings
    ok(api.call("PUT", "/API/v1/queues/once", {"settings": {"backoff_initial": 5,
                                                            "backoff_max": 60}}))
    settings = ok(api.call("GET", "/API/v1/queues/once"))["settings"]
    assert (settings["backoff_initial"], settings["backoff_max"]) == (5, 60)
    taken = ok(api.call("GET", "/API/v1/queues/once/messages?ack=false"))["id"]
    ok(api.call("POST", f"/API/v1/queues/once/messages/{taken}/nack", {"priority": 0,
                                                                       "delay": 3600}))
    held = api.call("GET", "/API/v1/queues/once/messages?ack=false")
    assert held.status == 400                                # held for an hour
    assert ok(api.call("GET", "/API/v1/queues/once"))["ready"] == 1
    for settings, where in (({"backoff_initial": 10, "backoff_max": 5}, "backoff_max"),
                            ({"backoff_initial": -1}, "backoff_initial")):
        bad = api.call("PUT", "/API/v1/queues/once", {"settings": settings})
        assert bad.status == 422 and where in bad.body.decode(), bad.body
    bad = api.call("POST", f"/API/v1/queues/once/messages/{taken}/nack",
                   {"priority": 0, "delay": -1})
    assert bad.status == 422 and bad.json()["errors"][0]["location"] == "body.delay"
    # TTL: expires_at in answers, a bad ttl refused
    ok(api.call("PUT", "/API/v1/queues/once", {"settings": {"message_ttl": 3600}}))
    assert ok(api.call("GET", "/API/v1/queues/once"))["settings"]["message_ttl"] == 3600
    fresh = ok(api.call("POST", "/API/v1/queues/once/messages", {
        "content": "t", "priority": 0, "ttl": 60}))
    got = ok(api.call("GET", f"/API/v1/queues/once/messages/{fresh['id']}"))
    assert got["expires_at"] == FixedClock().now() * 1000 + 60_000      # the node's clock
    bad = api.call("POST", "/API/v1/queues/once/messages", {"content": "t", "priority": 0,
                                                             "ttl": -5})
    assert bad.status == 422 and bad.json()["errors"][0]["location"] == "body.ttl"
    ok(api.call("PUT", "/API/v1/queues/cap", {"settings": {"dead_letter_queue": ""}}))
    ok(api.call("PUT", "/API/v1/queues/work", {"settings": {"dead_letter_queue": ""}}))
    ok(api.call("DELETE", "/API/v1/queues/dlq"))       # no longer in use


def controls(api: Api) -> None:
    """purge, pause and resume of a queue and of groups, the groups listing, and
    each refusal (state unchanged)."""
    ok(api.call("POST", "/API/v1/queues", {"name": "f", "type": "fair"}))
    ok(api.call("POST", "/API/v1/queues", {"name": "d", "type": "delayed"}))
    base = "/API/v1/queues/f/messages"
    for group in ("a", "a.b", "b", "a", "b"):
        ok(api.call("POST", base, {"content": group, "priority": 1, "group": group}))
    # a paused queue answers as an empty one does, with the reason; info says paused
    assert ok(api.call("POST", "/API/v1/queues/f/pause")) == {"status": "PAUSED"}
    paused = api.call("GET", f"{base}?ack=false")
    assert (paused.status, paused.json()["code"]) == (400, "queue_empty")
    assert paused.json()["errors"] == [{"message": "Queue is paused: f"}]
    assert ok(api.call("GET", f"{base}?ack=false&count=3"))["messages"] == []
    info = ok(api.call("GET", "/API/v1/queues/f"))
    assert info["paused"] is True and info["ready"] == 5
    ok(api.call("POST", base, {"content": "c", "priority": 1, "group": "c"}))   # still taken
    ok(api.call("PUT", "/API/v1/queues/f", {"settings": {"max_unacked": 5}}))
    assert ok(api.call("GET", "/API/v1/queues/f"))["paused"] is True       # kept by an update
    assert ok(api.call("POST", "/API/v1/queues/f/pause")) == {"status": "PAUSED"}  # again: ok
    assert ok(api.call("POST", "/API/v1/queues/f/resume")) == {"status": "RESUMED"}
    assert "paused" not in ok(api.call("GET", "/API/v1/queues/f"))
    # a paused group and its sub-groups are skipped; the listing says who pauses them
    out = ok(api.call("POST", "/API/v1/queues/f/groups/a/pause"))
    assert out == {"status": "PAUSED", "group": "a"}
    got = [ok(api.call("GET", f"{base}?ack=false"))["group"] for _ in range(3)]
    assert sorted(got) == ["b", "b", "c"]
    assert api.call("GET", f"{base}?ack=false").status == 400             # only a, a.b left
    groups = ok(api.call("GET", "/API/v1/queues/f/groups"))["groups"]
    assert groups == [
        {"group": "a", "ready": 2, "unacked": 0, "paused": True},
        {"group": "a.b", "ready": 1, "unacked": 0, "paused": True, "paused_by": "a"},
        {"group": "b", "ready": 0, "unacked": 2, "paused": False},
        {"group": "c", "ready": 0, "unacked": 1, "paused": False}]
    assert ok(api.call("GET", "/API/v1/queues/f"))["paused_groups"] == 1
    ok(api.call("PUT", "/API/v1/queues/f", {"settings": {"max_unacked": 0}}))
    assert ok(api.call("GET", "/API/v1/queues/f"))["paused_groups"] == 1   # kept by an update
    ok(api.call("POST", "/API/v1/queues/f/groups/a.b/pause"))
    ok(api.call("POST", "/API/v1/queues/f/groups/a/resume"))
    assert ok(api.call("GET", f"{base}?ack=false"))["group"] == "a"       # a.b still paused
    # refusals: nothing changes
    for path, status, code in (
            ("/API/v1/queues/d/groups/a/pause", 422, "invalid_argument"),   # not a fair queue
            ("/API/v1/queues/f/groups/ /pause", 422, "invalid_argument"),
            ("/API/v1/queues/nope/pause", 400, "queue_not_found"),
            ("/API/v1/queues/nope/groups/a/pause", 400, "queue_not_found"),
            ("/API/v1/queues/nope/purge", 400, "queue_not_found")):
        refused = api.call("POST", path)
        assert (refused.status, refused.json().get("code")) == (status, code), (path,
                                                                              refused.body)
    assert "delayed queue" in api.call("POST", "/API/v1/queues/d/groups/a/pause").body.decode()
    bad = api.call("POST", "/API/v1/queues/f/purge", {"include_unacked": "yes"})
    assert bad.status == 422 and bad.json()["errors"][0]["location"] == "body.include_unacked"
    assert api.call("GET", "/API/v1/queues/nope/groups").status == 400
    assert ok(api.call("GET", "/API/v1/queues/f"))["total"] == 6
    # purge: the waiting ones, then the delivered ones too
    assert ok(api.call("POST", "/API/v1/queues/f/purge")) == {"status": "PURGED", "purged": 2}
    info = ok(api.call("GET", "/API/v1/queues/f"))
    assert (info["ready"], info["unacked"]) == (0, 4)
    assert ok(api.call("POST", "/API/v1/queues/f/purge", {"include_unacked": True}))[
        "purged"] == 4
    assert ok(api.call("GET", "/API/v1/queues/f"))["total"] == 0
    assert ok(api.call("GET", "/API/v1/queues/f/groups"))["groups"] == [
        {"group": "a.b", "ready": 0, "unacked": 0, "paused": True}]
    ok(api.call("POST", "/API/v1/queues/f/groups/a.b/resume"))
    # the delivery limits: settings kept and answered, bad values refused naming the field
    limits = {"max_in_flight": 3, "group_rate": 2.5, "group_burst": 4}
    ok(api.call("PUT", "/API/v1/queues/f", {"settings": limits}))
    got = ok(api.call("GET", "/API/v1/queues/f"))["settings"]
    assert {k: got[k] for k in limits} == limits
    for bad in ({"group_burst": 0}, {"group_rate": -1}, {"group_rate": "fast"},
                {"max_in_flight": -1}, {"group_rate": 2_000_000}):
        refused = api.call("PUT", "/API/v1/queues/f", {"settings": bad})
        assert refused.status == 422, (bad, refused.body)
        assert refused.json()["errors"][0]["location"] == f"body.settings.{next(iter(bad))}"
    assert {k: ok(api.call("GET", "/API/v1/queues/f"))["settings"][k] for k in limits} == limits
    ok(api.call("DELETE", "/API/v1/queues/f"))
    ok(api.call("DELETE", "/API/v1/queues/d"))


def inspect(api: Api) -> None:
    """browse (pages, states, groups, nothing taken) and explain (each reason the
    state can give here), and their refusals."""
    now = int(FixedClock().now())
    ok(api.call("POST", "/API/v1/queues", {"name": "b", "type": "delayed"}))
    base = "/API/v1/queues/b/messages"
    ids = {p: ok(api.call("POST", base, {"content": f"p{p}", "priority": p}))["id"]
           for p in (3, 1, 2, now + 3600, 5)}
    before = ok(api.call("GET", "/API/v1/queues/b"))
    pages, after = [], None
    while True:
        query = "browse=true&state=ready&limit=2" + (f"&after={after}" if after else "")
        page = ok(api.call("GET", f"{base}?{query}"))
        pages.append([(m["content"], m["state"]) for m in page["messages"]])
        assert all("deadline" not in m for m in page["messages"])
        after = page["next"]
        if after is None:
            break
    # the one not due yet is held back (listed as blocked, as explain says)
    assert pages == [[("p1", "ready"), ("p2", "ready")], [("p3", "ready"), ("p5", "ready")],
                     [(f"p{now + 3600}", "blocked")]]
    assert ok(api.call("GET", "/API/v1/queues/b")) == before                 # nothing taken
    taken = ok(api.call("GET", f"{base}?ack=false"))
    assert taken["content"] == "p1"
    listed = ok(api.call("GET", f"{base}?browse=true"))["messages"]          # state=all
    assert [(m["content"], m["state"]) for m in listed] == [
        ("p2", "ready"), ("p3", "ready"), ("p5", "ready"), (f"p{now + 3600}", "blocked"),
        ("p1", "unacked")]
    assert listed[-1]["deadline"] > now * 1000 and listed[-1]["deliveries"] == 1
    unacked = ok(api.call("GET", f"{base}?browse=1&state=unacked"))
    assert [m["id"] for m in unacked["messages"]] == [taken["id"]] and unacked["next"] is None
    # explain: ready with its place, delayed, delivered, paused, held back
    assert ok(api.call("GET", f"{base}/{ids[3]}/explain")) == {
        "id": ids[3], "state": "ready", "reasons": [], "ahead": 1}
    assert ok(api.call("GET", f"{base}/{ids[now + 3600]}/explain")) == {
        "id": ids[now + 3600], "state": "blocked", "ahead": 3,
        "reasons": [{"code": "delayed_until", "until": (now + 3600) * 1000}]}
    assert ok(api.call("GET", f"{base}/{taken['id']}/explain"))["state"] == "unacked"
    # a named consumer holds one; the queue knows it
    mine = ok(api.call("GET", f"{base}?ack=false&consumer=local-1"))
    assert ok(api.call("GET", f"{base}/{mine['id']}/explain"))["held_by"]["consumer"] == \
        "local-1"
    known = ok(api.call("GET", "/API/v1/queues/b/consumers"))["consumers"]
    assert [(c["name"], c["held"], c["messages"]) for c in known] == [
        ("local-1", 1, [mine["id"]])]
    ok(api.call("POST", f"{base}/{mine['id']}/nack", {"delivery": mine["delivery"]}))
    assert api.call("POST", f"{base}/{mine['id']}/ack",
                    {"delivery": mine["delivery"]}).status == 409       # settled already
    ok(api.call("POST", "/API/v1/queues/b/pause"))
    assert ok(api.call("GET", f"{base}/{ids[2]}/explain"))["reasons"] == [
        {"code": "queue_paused"}]
    ok(api.call("POST", "/API/v1/queues/b/resume"))
    ok(api.call("POST", f"{base}/{taken['id']}/nack", {"priority": 0, "delay": 60}))
    assert ok(api.call("GET", f"{base}/{taken['id']}/explain")) == {     # the 3 due ones
        "id": taken["id"], "state": "blocked", "ahead": 3,
        "reasons": [{"code": "backoff_until", "until": (now + 60) * 1000}]}
    # fair groups: a paused parent, a group at its in-flight limit
    ok(api.call("POST", "/API/v1/queues", {"name": "g", "type": "fair",
                                            "settings": {"max_unacked": 1}}))
    fair = "/API/v1/queues/g/messages"
    sub = ok(api.call("POST", fair, {"content": "s", "priority": 1, "group": "t.sub"}))["id"]
    busy = [ok(api.call("POST", fair, {"content": f"x{n}", "priority": 1, "group": "x"}))["id"]
            for n in range(2)]
    ok(api.call("POST", "/API/v1/queues/g/groups/t/pause"))
    assert ok(api.call("GET", f"{fair}?ack=false"))["id"] == busy[0]
    assert ok(api.call("GET", f"{fair}/{sub}/explain"))["reasons"] == [
        {"code": "group_paused", "group": "t"}]
    assert ok(api.call("GET", f"{fair}/{busy[1]}/explain")) == {
        "id": busy[1], "state": "blocked", "ahead": 0,
        "reasons": [{"code": "group_at_max_unacked", "group": "x", "unacked": 1, "max": 1}]}
    page = ok(api.call("GET", f"{fair}?browse=true&state=ready&group=x"))
    assert [(m["id"], m["state"]) for m in page["messages"]] == [(busy[1], "blocked")]
    # refusals
    for query, where in (("state=some", "query.state"), ("limit=0", "query.limit"),
                         ("limit=1001", "query.limit"), ("after=x", "query.after"),
                         ("group=%00", "query.group")):
        bad = api.call("GET", f"{base}?browse=true&{query}")
        assert bad.status == 422 and bad.json()["errors"][0]["location"] == where, query
    gone = api.call("GET", f"{base}?browse=true&state=ready&after=999")      # not there
    assert gone.status == 422 and "after" in gone.json()["errors"][0]["message"]
    held = ok(api.call("GET", f"{base}?browse=true&state=ready&after={ids[5]}"))  # held: last
    assert [m["id"] for m in held["messages"]] == [ids[now + 3600], ids[1]]
    assert api.call("GET", f"{base}/12345/explain").json()["code"] == "message_not_found"
    assert api.call("GET", "/API/v1/queues/nope/messages?browse=true").status == 400
    assert ok(api.call("GET", "/API/v1/queues/b"))["total"] == 5
    for name in ("b", "g"):
        ok(api.call("DELETE", f"/API/v1/queues/{name}"))


def schedules(api: Api) -> None:
    ok(api.call("POST", "/API/v1/queues", {"name": "s", "type": "fair"}))
    base = "/API/v1/queues/s/schedules"
    made = ok(api.call("POST", base, {"name": "tick", "every": 5, "message": {
        "content": "hi", "group": "g", "metadata": {"k": "v"}}}))
    assert made["status"] == "CREATED"
    assert made["schedule"] == {
        "name": "tick", "every": 5, "message": {"content": "hi", "group": "g",
                                                "metadata": {"k": "v"}},
        "catch_up": "one", "grace": 60, "paused": False, "next_at": 1_700_000_000,
        "last_fired": None, "fired": 0, "skipped": 0, "refused": 0, "last_error": None,
        "created_at": 1_700_000_000}
    again = ok(api.call("POST", base, {"name": "tick", "every": 5, "message": {
        "content": "hi", "group": "g", "metadata": {"k": "v"}}}))
    assert again["status"] == "UNCHANGED"
    nightly = {"name": "nightly", "cron": "30 2 * * *", "timezone": "Europe/Berlin",
               "message": {"content": "n", "priority": 3}, "catch_up": "all",
               "start_at": 1_700_000_000, "end_at": 1_800_000_000, "grace": 600, "paused": True}
    shown = ok(api.call("POST", base, nightly))["schedule"]
    assert (shown["cron"], shown["timezone"], shown["paused"], shown["next_at"]) == (
        "30 2 * * *", "Europe/Berlin", True, 1_700_011_800)     # 2023-11-15 02:30 CET
    listed = ok(api.call("GET", base))["schedules"]
    assert [x["name"] for x in listed] == ["nightly", "tick"]
    assert ok(api.call("GET", f"{base}/nightly")) == shown
    assert ok(api.call("POST", f"{base}/nightly/resume"))["changed"] is True
    assert ok(api.call("POST", f"{base}/tick/pause")) == {"status": "PAUSED", "name": "tick",
                                                          "changed": True}
    ok(api.call("DELETE", f"{base}/nightly"))
    # refusals: each names its field; nothing changes
    for body, where in (
            ({"name": "x", "cron": "* *", "message": {"content": "c"}}, "body.cron"),
            ({"name": "x", "message": {"content": "c"}}, "body.cron"),
            ({"name": "x", "every": 0, "message": {"content": "c"}}, "body.every"),
            ({"name": "x", "every": 1, "cron": "* * * * *", "message": {"content": "c"}},
             "body.cron"),
            ({"name": "x", "cron": "@reboot", "message": {"content": "c"}}, "body.cron"),
            ({"name": "x", "cron": "* * * * *", "timezone": "Mars/Base",
              "message": {"content": "c"}}, "body.timezone"),
            ({"name": "a b", "every": 1, "message": {"content": "c"}}, "body.name"),
            ({"name": "x", "every": 1, "message": {}}, "body.message"),
            ({"name": "x", "every": 1, "message": {"content": "c", "metadata": {
                "x-schedule": "forged"}}}, "body.message.metadata.x-schedule"),
            ({"name": "x", "every": 1, "message": {"content": "c"}, "catch_up": "most"},
             "body.catch_up"),
            ({"name": "x", "every": 1, "message": {"content": "c"}, "cronn": "* * * * *"},
             "body.cronn"),
            ({"name": "x", "every": 1, "message": {"content": "c"}, "start_at": 10,
              "end_at": 9}, "body.end_at")):
        bad = api.call("POST", base, body)
        assert bad.status == 422, (body, bad.body)
        assert bad.json()["errors"][0]["location"] == where, (body, bad.body)
    assert [x["name"] for x in ok(api.call("GET", base))["schedules"]] == ["tick"]
    missing = api.call("GET", f"{base}/nope")
    assert (missing.status, missing.json()["code"]) == (404, "schedule_not_found")
    assert api.call("DELETE", f"{base}/nope").status == 404
    assert api.call("POST", f"{base}/nope/pause").status == 404
    assert api.call("GET", f"{base}/a%20b").status == 422
    gone = api.call("GET", "/API/v1/queues/nope/schedules")
    assert (gone.status, gone.json()["code"]) == (400, "queue_not_found")
    ok(api.call("DELETE", "/API/v1/queues/s"))


def cluster_and_admin(api: Api) -> None:
    servers = ok(api.call("GET", "/API/v1/cluster/servers"))["servers"]
    assert [(s["is_leader"], s["suffrage"]) for s in servers] == [(True, "Voter")]
    closed = free_ports(1)[0]                        # nothing answers there: not verified
    refused = api.call("POST", "/API/v1/cluster/join", {"id": "n9", "addr": f"127.0.0.1:{closed}"})
    assert (refused.status, refused.json()["code"]) == (422, "peer_unverified")
    unknown = api.call("POST", "/API/v1/cluster/leave", {"id": "nobody"})
    assert (unknown.status, unknown.json()["code"]) == (404, "member_not_found")
    assert ok(api.call("GET", "/internal/status"))["raft"]["state"] == "leader"
    digest = ok(api.call("GET", "/internal/state"))["queue_digest"]
    backup = api.call("POST", "/db/backup", {})
    assert backup.status == 200 and backup.headers["content-type"] == "application/octet-stream"
    restored = ok(api.call("POST", "/db/restore", raw=backup.body,
                           content_type="application/octet-stream"))
    assert restored["status"] == "SUCCEDED"
    assert ok(api.call("GET", "/internal/state"))["queue_digest"] == digest
    torn = api.call("POST", "/db/restore", raw=backup.body[:-10],
                    content_type="application/octet-stream")
    assert (torn.status, torn.json()["detail"]) == (400, "invalid backup file")


def test_queues(api: Api) -> None:
    queues(api)


def test_messages(api: Api) -> None:
    messages(api)


def test_cluster_and_admin(api: Api) -> None:
    messages(api)
    cluster_and_admin(api)


def test_dead_letters(api: Api) -> None:
    dead_letters(api)


def test_controls(api: Api) -> None:
    controls(api)


def test_inspect(api: Api) -> None:
    inspect(api)


def test_schedules(api: Api) -> None:
    schedules(api)


def test_these_tests_answer_on_every_route(api: Api) -> None:
    for scenario in (queues, messages, dead_letters, controls, inspect, schedules,
                     cluster_and_admin):
        scenario(api)
    assert {op for _, _, op, _ in ROUTES} - api.routes == set()


def test_a_full_disk_is_507_for_new_messages(api: Api, local: LocalNode) -> None:
    ok(api.call("POST", "/API/v1/queues", {"name": "q", "type": "delayed"}))
    local.service.disk.problem = lambda: "insufficient storage: test"  # type: ignore[method-assign]
    refused = api.call("POST", "/API/v1/queues/q/messages", {"content": "x", "priority": 1})
    body = refused.json()
    assert (refused.status, body["code"]) == (507, "insufficient_storage"), body
    assert body["errors"] == [{"message": "insufficient storage: test"}]


def test_unknown_paths_are_404_problems_and_the_ui_pages_are_served(api: Api) -> None:
    """a GET on a path that matched no route (/API/v1/nope, /internal/nope, and
    /metrics on a node without Prometheus, as this one) was answered 200 with the web UI."""
    for path in ("/API/v1/nope", "/internal/nope", "/metrics", "/db/nope", "/nope",
                 "/assets/nope.js", "/API/v1/queues/q/nope"):
        answer = api.call("GET", path)
        assert answer.status == 404, (path, answer.status)
        assert answer.headers["content-type"].startswith("application/problem+json"), path
    for page in ("/", "/queues/some%20queue", "/servers", "/cluster"):
        answer = api.call("GET", page)
        assert answer.status == 200 and b"<html" in answer.body.lower(), page
    assert api.call("POST", "/queues/x").status == 404


def test_a_batch_ack_stores_messages_per_id(api: Api) -> None:
    for name in ("src", "out"):
        ok(api.call("POST", "/API/v1/queues", {"name": name, "type": "delayed"}))
    base = "/API/v1/queues/src/messages"
    ok(api.call("POST", f"{base}/batch", {"messages": [
        {"content": f"in{n}", "priority": n + 1} for n in range(3)]}))
    taken = ok(api.call("GET", f"{base}?ack=false&count=3"))["messages"]
    out = ok(api.call("POST", f"{base}/ack", {"ids": [
        {"id": taken[0]["id"], "delivery": taken[0]["delivery"],
         "enqueue": [{"queue": "out", "content": "r0", "priority": 1},
                     {"queue": "out", "content": "r0b", "priority": 2}]},
        {"id": taken[1]["id"], "enqueue": [{"queue": "nope", "content": "x", "priority": 1}]},
        taken[2]["id"]]}))
    assert out["acked"] == [taken[0]["id"], taken[2]["id"]]
    assert [(f["id"], f["code"]) for f in out["failed"]] == [(taken[1]["id"],
                                                               "queue_not_found")]
    assert "nope" in out["failed"][0]["detail"]
    assert list(out["enqueued"]) == [taken[0]["id"]] and len(out["enqueued"][taken[0]["id"]]) == 2
    assert ok(api.call("GET", "/API/v1/queues/out"))["total"] == 2
    assert ok(api.call("GET", "/API/v1/queues/src"))["unacked"] == 1     # the failed one
    bad = api.call("POST", f"{base}/ack", {"ids": [{"id": taken[1]["id"], "enqueue": [
        {"queue": "out", "content": "x"}]}]})
    assert bad.status == 422 and "body.ids[0].enqueue[0]" in bad.body.decode()


def test_an_enqueue_with_a_delay_waits(api: Api, local: LocalNode) -> None:
    ok(api.call("POST", "/API/v1/queues", {"name": "f", "type": "fair"}))
    base = "/API/v1/queues/f/messages"
    later = ok(api.call("POST", base, {"content": "later", "priority": 1, "group": "g",
                                       "delay": 60}))
    ok(api.call("POST", f"{base}/batch", {"messages": [
        {"content": "soon", "priority": 1, "delay": 10}, {"content": "now", "priority": 1}]}))
    assert ok(api.call("GET", f"{base}?ack=true"))["content"] == "now"
    assert api.call("GET", f"{base}?ack=true").status == 400           # nothing due yet
    assert ok(api.call("GET", f"{base}/{later['id']}/explain"))["reasons"] == [
        {"code": "delayed_until", "until": int(local.clock.t * 1000) + 60_000}]
    local.clock.t += 61
    local.service.submit(C.requeue_expired())          # the leader's redelivery round
    assert sorted(m["content"] for m in ok(api.call("GET", f"{base}?ack=true&count=5"))[
        "messages"]) == ["later", "soon"]
    bad = api.call("POST", base, {"content": "x", "priority": 1, "delay": 30 * 86400 + 1})
    assert bad.status == 422 and bad.json()["errors"][0]["location"] == "body.delay"
