"""The bad-input corpus: what a careless or hostile client sends over HTTP, gRPC,
the Raft port and backup files, against one node. Every case asserts the answer (status and
code), that the message names the problem (the field, or words of it), and that the queue
state is unchanged (the store's digest before and after). docs/RELIABILITY.md sums it up.

The cases are generated from tables: each field of each request body with each kind of
wrong value, bodies that are not what they claim, paths and queries, then gRPC requests per
RPC and field, frames that do not parse, bytes at the Raft port and crafted backup files.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import grpc
import pytest

from doq_lib import rules, schedules
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from doq_lib.store import U64
from tests.core.test_backup import _message_record, _queue_record, forge
from tests.grpc.test_flow_control import BATCH, Counting, Keys, still_answers, stream_ways
from tests.harness import Cluster, Http, NodeProc

SURROGATE = "\udfff"
Q, R, U = "victim", "{ready}", "{unacked}"     # path placeholders, filled per node


@dataclass
class Victim:
    node: NodeProc
    http: Http
    stub: pb_grpc.DOQStub
    channel: grpc.Channel
    ready: str
    unacked: str

    def digest(self) -> str:
        return str(self.node.state()["queue_digest"])

    def fill(self, text: str) -> str:
        return text.replace("{ready}", self.ready).replace("{unacked}", self.unacked)


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Victim]:
    cluster = Cluster(str(tmp_path_factory.mktemp("corpus")), size=1,
                      flags={"grpc.address": "127.0.0.1:0"}).start()
    node = cluster.nodes[0]
    http = node.http()
    channel = grpc.insecure_channel(str(node.status()["grpc_addr"]))
    try:
        assert http.post("/API/v1/queues", {"name": Q, "type": "fair", "settings": {
            "max_unacked": 5, "ack_timeout": 3600}}).status == 200
        unacked = http.post(f"/API/v1/queues/{Q}/messages", {
            "priority": 1, "content": "u", "group": "g", "metadata": {"k": "u"}}).json()["id"]
        ready = http.post(f"/API/v1/queues/{Q}/messages", {
            "priority": 5, "content": "r", "group": "g"}).json()["id"]
        assert http.get(f"/API/v1/queues/{Q}/messages?ack=false").json()["id"] == unacked
        yield Victim(node, http, pb_grpc.DOQStub(channel), channel, ready, unacked)
    finally:
        channel.close()
        http.close()
        cluster.stop()


# == HTTP ======================================================================================
@dataclass(frozen=True)
class HttpCase:
    id: str
    method: str
    path: str
    raw: bytes | None = None              # the body as sent (None: none)
    status: int = 422
    names: str = ""                       # in the problem's location or message
    headers: dict[str, str] = field(default_factory=lambda: {
        "Content-Type": "application/json"})


def body_case(id: str, method: str, path: str, body: Any, names: str,
              status: int = 422) -> HttpCase:
    return HttpCase(id, method, path, json.dumps(body).encode(), status, names)


# Wrong values by kind, each named for the case id.
NOT_STRING = {"int": 5, "bool": True, "null": None, "list": ["x"], "object": {"a": "b"}}
NOT_INT = {"string": "5", "bool": False, "null": None, "list": [1], "object": {},
           "fraction": 1.5, "negative": -1}
STRINGS_BROKEN = {"surrogate": "a" + SURROGATE, "lone-high": "\ud800"}
LABELS_BROKEN = {"dot": ".", "dotdot": "..", "blank": "   ", "nul": "a\x00b", "crlf": "a\r\nb",
                 "tab": "\tx", "del": "a\x7f", "c1": "a\x85"}
METADATA_BROKEN: dict[str, Any] = {
    "string": "k=v", "list": [["k", "v"]], "value-int": {"k": 5}, "value-null": {"k": None},
    "empty-key": {"": "v"}, "key-newline": {"a\nb": "v"}, "key-dotdot": {"..": "v"},
    "key-surrogate": {SURROGATE: "v"}, "value-surrogate": {"k": SURROGATE},
    "too-many": {f"k{i}": "v" for i in range(rules.MAX_METADATA + 1)},
    "key-too-long": {"k" * (rules.MAX_METADATA_KEY + 1): "v"},
    "value-too-long": {"k": "v" * (rules.MAX_METADATA_VALUE + 1)},
    # the server's own keys (a message could claim to be a dead letter)
    "reserved-dead-from": {"x-dead-from": "secret"},
    "reserved-dead-reason": {"x-dead-reason": "rejected"},
    "reserved-deliveries": {"x-deliveries": "1"},
    "reserved-last-error": {"x-last-error": "boom"},
    "reserved-schedule": {"x-schedule": "s"}, "reserved-scheduled-at": {"x-scheduled-at": "t"},
    # ... in any case
    "reserved-upper": {"X-DEAD-REASON": "rejected"}, "reserved-mixed": {"X-Schedule": "s"},
    "reserved-title": {"X-Deliveries": "1"},
}


def field_cases(route: str, method: str, path: str, valid: dict[str, Any],
                fields: dict[str, dict[str, Any]], prefix: str = "body") -> list[HttpCase]:
    """A case per (field, wrong value): ``valid`` with one field replaced."""
    out = []
    for name, wrong in fields.items():
        for kind, value in wrong.items():
            body = {**valid, name: value}
            out.append(body_case(f"{route}-{name}-{kind}", method, path, body,
                                 f"{prefix}.{name}"))
    return out


MSG = f"/API/v1/queues/{Q}/messages"
ENQUEUE = {"priority": 1, "content": "x"}
PRIORITY_BROKEN = {**NOT_INT, "past-int64": 2 ** 63}
HTTP_CASES: list[HttpCase] = []
HTTP_CASES += field_cases("enqueue", "POST", MSG, ENQUEUE, {
    "priority": PRIORITY_BROKEN,
    "content": {**NOT_STRING, **STRINGS_BROKEN},
    "group": {**NOT_STRING, **STRINGS_BROKEN, **LABELS_BROKEN,
              "too-long": "g" * (rules.MAX_GROUP + 1), **{
                  # a group is a path of at most 16 labels and 256 bytes
                  "too-deep": ".".join(["l"] * (rules.MAX_GROUP_DEPTH + 1)),
                  "1024-levels": ".".join(["l"] * 1024)[:1023],
                  "too-many-bytes": "é" * (rules.MAX_GROUP // 2 + 1),
                  "empty-label": "a..b", "leading-dot": ".a", "trailing-dot": "a."}},
    "metadata": METADATA_BROKEN,
    "id": {"letters": "abc", "negative": "-1", "past-int63": str(2 ** 63), "list": [1]},
    "delay": {**NOT_INT, "past-30-days": rules.MAX_DELAY + 1, "huge": 2 ** 64},
})
HTTP_CASES += [body_case(f"enqueue-missing-{name}", "POST", MSG,
                         {k: v for k, v in ENQUEUE.items() if k != name},
                         f"required property {name}") for name in ENQUEUE]
HTTP_CASES += [body_case("enqueue-unknown-property", "POST", MSG, {**ENQUEUE, "colour": 1},
                         "body.colour")]
HTTP_CASES += [body_case(f"batch-{kind}", "POST", MSG + "/batch",
                         {"messages": [ENQUEUE, {**ENQUEUE, name: value}]},
                         f"body.messages[1].{name}")
               for kind, name, value in (
                   ("priority-negative", "priority", -1), ("content-int", "content", 5),
                   ("content-surrogate", "content", SURROGATE), ("group-dotdot", "group", ".."),
                   ("metadata-empty-key", "metadata", {"": "v"}))]
HTTP_CASES += [
    body_case("batch-empty", "POST", MSG + "/batch", {"messages": []}, "at least 1 items"),
    body_case("batch-too-many", "POST", MSG + "/batch", {"messages": [ENQUEUE] * 1001},
              "at most 1000 items"),
    body_case("batch-not-list", "POST", MSG + "/batch", {"messages": ENQUEUE},
              "body.messages"),
]
NEW = "never-created"
CREATE = {"name": NEW, "type": "fair"}
HTTP_CASES += field_cases("create", "POST", "/API/v1/queues", CREATE, {
    "name": {**NOT_STRING, **STRINGS_BROKEN, **LABELS_BROKEN, "empty": "", "slash": "a/b",
             "too-long": "n" * (rules.MAX_NAME + 1)},
    "type": {**NOT_STRING, "lifo": "lifo", "upper": "FAIR", "empty": ""},
    "settings": {"string": "x", "list": [], "int": 5},
})
SETTINGS_BROKEN = {
    "strategy": {"fifo": "fifo", "upper": "WEIGHTED", "int": 1},
    "max_unacked": {**NOT_INT, "past-uint32": 2 ** 32},
    "ack_timeout": {**NOT_INT, "below-60": 59, "zero": 0, "past-uint32": 2 ** 32},
}
for key, wrong in SETTINGS_BROKEN.items():
    for kind, value in wrong.items():
        HTTP_CASES.append(body_case(f"create-settings-{key}-{kind}", "POST", "/API/v1/queues",
                                    {"name": NEW, "type": "fair", "settings": {key: value}},
                                    f"body.settings.{key}"))
        HTTP_CASES.append(body_case(f"update-settings-{key}-{kind}", "PUT",
                                    f"/API/v1/queues/{Q}", {"settings": {key: value}},
                                    f"body.settings.{key}"))
NACK = f"{MSG}/{U}/nack"
HTTP_CASES += field_cases("nack", "POST", NACK, {"priority": 1}, {
    "priority": PRIORITY_BROKEN,
    "metadata": {k: v for k, v in METADATA_BROKEN.items() if k != "value-null"},
})
# Delivery tokens: garbage, another message's, a stale one.
DELIVERY_BROKEN: dict[str, Any] = {
    **{k: v for k, v in NOT_STRING.items() if k != "null"}, **STRINGS_BROKEN,
    "garbage": "abc", "two-parts": f"{U}-1", "zero-count": f"{U}-0-5",
    "count-past-uint32": f"{U}-{2 ** 32}-5", "time-past-int63": f"{U}-1-{2 ** 63}",
    "signs": f"+{U}-1-5", "spaces": f" {U}-1-5", "too-long": "1" * (rules.MAX_TOKEN + 1),
    "fullwidth-digits": "１-1-5", "another-message": f"{R}-1-5"}
HTTP_CASES += field_cases("reject", "POST", f"{MSG}/{U}/reject", {}, {"reason": {
    **NOT_STRING, "unknown": "bored", "upper": "REJECTED", "dead-reason": "expired"}})
for route, path, valid in (("nack", NACK, {}), ("reject", f"{MSG}/{U}/reject", {}),
                           ("ack", f"{MSG}/{U}/ack", {}), ("touch", f"{MSG}/{U}/touch", {})):
    HTTP_CASES += field_cases(route, "POST", path, valid, {"delivery": DELIVERY_BROKEN})
    # well formed, but not the current delivery: 409, nothing changes
    HTTP_CASES.append(body_case(f"{route}-delivery-stale", "POST", path,
                                {"delivery": f"{U}-1-5"}, "stale delivery", 409))
    # an id that never existed is not found, token or not
    missing = path.replace(U, "999999")
    HTTP_CASES.append(body_case(f"{route}-never-existed", "POST", missing, {},
                                "Message not found", 400))
    HTTP_CASES.append(body_case(f"{route}-never-existed-with-token", "POST", missing,
                                {"delivery": "999999-1-5"}, "Message not found", 400))
HTTP_CASES += [HttpCase(f"dequeue-consumer-{kind}", "GET", f"{MSG}?ack=false&consumer={raw}",
                        None, status, says)
               for kind, raw, status, says in (("not-utf8", "%FF%FE", 400, "not UTF-8"),
                                               ("c1-control", "%C2%85x", 422, "query.consumer"),
                                               ("too-many-bytes", "%C3%A9" * 101, 422,
                                                "query.consumer"))]
HTTP_CASES += [HttpCase(f"{route}-query-delivery-{kind}", "POST",
                        f"{MSG}/{U}/{route}?delivery={urllib.parse.quote(value)}", None, 422,
                        "query.delivery")
               for route in ("ack", "touch")
               for kind, value in (("garbage", "abc"), ("another-message", f"{R}-1-5"),
                                   ("empty", ""))]
HTTP_CASES += [HttpCase(f"{route}-query-delivery-stale", "POST",
                        f"{MSG}/{U}/{route}?delivery={U}-1-5", None, 409, "stale delivery")
               for route in ("ack", "touch")]
HTTP_CASES.append(HttpCase("ack-body-and-query-disagree", "POST",
                           f"{MSG}/{U}/ack?delivery={U}-1-5",
                           json.dumps({"delivery": f"{U}-1-6"}).encode(), 422, "query.delivery"))
for route in ("ack-batch", "nack-batch"):
    path = f"{MSG}/{route.split('-')[0]}"
    HTTP_CASES += [body_case(f"{route}-item-delivery-{kind}", "POST", path,
                             {"ids": [{"id": U, "delivery": value}]}, "body.ids[0].delivery")
                   for kind, value in DELIVERY_BROKEN.items()]
    HTTP_CASES += [body_case(f"{route}-item-{kind}", "POST", path, {"ids": items}, where)
                   for kind, items, where in (
                       ("no-id", [{"delivery": f"{U}-1-5"}], "required property id"),
                       ("id-letters", [{"id": "abc"}], "body.ids[0]"),
                       ("unknown-key", [{"id": U, "colour": 1}], "body.ids[0].colour"),
                       ("duplicate", [{"id": U}, U], "duplicate"))]
# Settle-and-enqueue items: a bad element refuses the whole settle.
ITEM_OK = {"queue": Q, "content": "r", "priority": 1}
for route in ("ack", "nack", "reject"):
    HTTP_CASES += [body_case(f"{route}-enqueue-{kind}", "POST", f"{MSG}/{U}/{route}",
                             {"enqueue": value}, where)
                   for kind, value, where in (
                       ("not-list", {"queue": Q}, "body.enqueue"),
                       ("too-many", [ITEM_OK] * 101, "at most 100 items"),
                       ("no-queue", [{"content": "r", "priority": 1}], "required property queue"),
                       ("queue-slash", [{**ITEM_OK, "queue": "a/b"}], "body.enqueue[0].queue"),
                       ("queue-empty", [{**ITEM_OK, "queue": ""}], "body.enqueue[0].queue"),
                       ("priority-negative", [ITEM_OK, {**ITEM_OK, "priority": -1}],
                        "body.enqueue[1].priority"),
                       ("group-too-deep", [{**ITEM_OK, "group": ".".join("l" * 17)}],
                        "body.enqueue[0].group"),
                       ("metadata-reserved", [{**ITEM_OK, "metadata": {"x-dead-from": "s"}}],
                        "body.enqueue[0].metadata"),
                       ("id-letters", [{**ITEM_OK, "id": "abc"}], "body.enqueue[0].id"),
                       ("delay-past-30-days", [{**ITEM_OK, "delay": rules.MAX_DELAY + 1}],
                        "body.enqueue[0].delay"),
                       ("unknown-key", [{**ITEM_OK, "colour": 1}], "body.enqueue[0].colour"))]
    HTTP_CASES.append(body_case(f"{route}-enqueue-unknown-queue", "POST", f"{MSG}/{U}/{route}",
                                {"enqueue": [{**ITEM_OK, "queue": "nope"}]}, "nope", 400))
# A batch ack whose ids store messages: a bad element refuses the whole request.
HTTP_CASES += [body_case(f"ack-batch-enqueue-{kind}", "POST", f"{MSG}/ack",
                         {"ids": [{"id": U, "enqueue": value}]}, where)
               for kind, value, where in (
                   ("not-list", {"queue": Q}, "body.ids[0].enqueue"),
                   ("too-many", [ITEM_OK] * 101, "at most 100 items"),
                   ("no-queue", [{"content": "r", "priority": 1}], "required property queue"),
                   ("priority-negative", [ITEM_OK, {**ITEM_OK, "priority": -1}],
                    "body.ids[0].enqueue[1].priority"),
                   ("metadata-reserved", [{**ITEM_OK, "metadata": {"x-schedule": "s"}}],
                    "body.ids[0].enqueue[0].metadata"),
                   ("id-letters", [{**ITEM_OK, "id": "abc"}], "body.ids[0].enqueue[0].id"))]
HTTP_CASES.append(body_case("ack-batch-enqueue-past-1000-in-all", "POST", f"{MSG}/ack",
                            {"ids": [{"id": str(n), "enqueue": [ITEM_OK] * 100}
                                     for n in range(1, 12)]}, "at most 1000 messages"))
IDS_BROKEN: dict[str, Any] = {"string": "1", "object": {}, "empty": [], "letters": ["abc"],
                              "negative": [-1], "past-uint64": [str(2 ** 64)],
                              "duplicate": [U, U], "too-many": [str(i) for i in range(1, 1002)],
                              "bool": [True]}
for route, path in (("ack-batch", f"{MSG}/ack"), ("nack-batch", f"{MSG}/nack")):
    HTTP_CASES += field_cases(route, "POST", path, {"ids": [U]}, {"ids": IDS_BROKEN})
HTTP_CASES += field_cases("update-priority", "PUT", f"{MSG}/{R}/priority", {"priority": 3},
                          {"priority": PRIORITY_BROKEN})
HTTP_CASES += field_cases("generate-ids", "POST", "/API/v1/ids", {"number": 2}, {
    "number": {**NOT_INT, "zero": 0, "past-1000": 1001}})
HTTP_CASES += field_cases("backup", "POST", "/db/backup", {"since": 0}, {
    "since": {**NOT_INT, "past-uint64": 2 ** 64}})
# Operator controls: purge's body, group paths, browse's query, explain's id.
HTTP_CASES += field_cases("purge", "POST", f"/API/v1/queues/{Q}/purge", {}, {
    "include_unacked": {"string": "true", "int": 1, "null": None, "list": [True]}})
HTTP_CASES += [HttpCase(f"group-{action}-{kind}", "POST",
                        f"/API/v1/queues/{Q}/groups/{urllib.parse.quote(label, safe='')}/"
                        f"{action}", None, 422, "path.group")
               for action in ("pause", "resume")
               for kind, label in {**LABELS_BROKEN,
                                   "too-long": "g" * (rules.MAX_GROUP + 1),
                                   "too-deep": ".".join(["l"] * 17),
                                   "empty-label": "a..b"}.items()]
HTTP_CASES += [HttpCase(f"browse-{name}-{kind}", "GET", f"{MSG}?browse=true&{name}={value}",
                        None, 422, f"query.{name}")
               for name, values in (("state", ("x", "READY", "")),
                                    ("limit", ("0", "1001", "x", "-1", "1.5")),
                                    ("after", ("x", "0", "-1", str(2 ** 64))),
                                    ("group", ("%00", "%20%20", "..")))
               for kind, value in ((v or "empty", v) for v in values)]
HTTP_CASES += [
    HttpCase("browse-after-gone", "GET", f"{MSG}?browse=true&state=ready&after=12345", None,
             422, "after"),
    HttpCase("explain-unknown", "GET", f"{MSG}/12345/explain", None, 400,
             "Failed to get a message from a queue: victim"),
    HttpCase("pause-unknown-queue", "POST", "/API/v1/queues/nope/pause", None, 400,
             "Failed to get a queue: nope"),
    HttpCase("groups-unknown-queue", "GET", "/API/v1/queues/nope/groups", None, 400,
             "Failed to get a queue: nope"),
    HttpCase("browse-unknown-queue", "GET", "/API/v1/queues/nope/messages?browse=true", None,
             400, "Failed to get a queue: nope"),
]
for key, kind, value in (("max_in_flight", "negative", -1), ("max_in_flight", "string", "2"),
                         ("group_rate", "negative", -0.5), ("group_rate", "string", "5"),
                         ("group_rate", "too-fast", 2e6), ("group_burst", "zero", 0),
                         ("group_rate", "subnormal", 5e-324), ("group_rate", "too-slow", 1e-13),
                         ("group_rate", "just-below-minimum", rules.MIN_GROUP_RATE * 0.99),
                         ("group_burst", "fraction", 1.5)):
    HTTP_CASES.append(body_case(f"update-settings-{key}-{kind}", "PUT", f"/API/v1/queues/{Q}",
                                {"settings": {key: value}}, f"body.settings.{key}"))

# Bodies that are not what they claim, on every route that takes one.
BODY_ROUTES = [("create", "POST", "/API/v1/queues"), ("update", "PUT", f"/API/v1/queues/{Q}"),
               ("enqueue", "POST", MSG), ("batch", "POST", MSG + "/batch"),
               ("nack", "POST", NACK), ("ack-batch", "POST", f"{MSG}/ack"),
               ("nack-batch", "POST", f"{MSG}/nack"),
               ("priority", "PUT", f"{MSG}/{R}/priority"), ("ids", "POST", "/API/v1/ids")]
RAW_BODIES: list[tuple[str, bytes, int, str]] = [
    ("empty", b"", 400, "request body is required"),
    ("truncated", b'{"priority": 1', 400, "Expecting"),
    ("not-json", b"priority=1", 400, "Expecting value"),
    ("array", b"[1, 2]", 422, "expected object"),
    ("string", b'"x"', 422, "expected object"),
    ("number", b"7", 422, "expected object"),
    ("null", b"null", 422, "expected object"),
    ("nan", b'{"priority": NaN}', 400, "NaN"),
    ("infinity", b'{"priority": 1e999}', 400, "out of range"),
    ("deep", b"[" * 100000 + b"]" * 100000, 400, "body"),
    ("latin-1", b'{"content": "\xe9"}', 400, "body"),      # not UTF-8
]
for route, method, path in BODY_ROUTES:
    for kind, raw, status, names in RAW_BODIES:
        HTTP_CASES.append(HttpCase(f"{route}-body-{kind}", method, path, raw, status, names))
    HTTP_CASES.append(HttpCase(f"{route}-text-plain", method, path, b"{}", 415, "Content-Type",
                               {"Content-Type": "text/plain"}))
    HTTP_CASES.append(HttpCase(f"{route}-form", method, path, b"a=b", 415, "Content-Type",
                               {"Content-Type": "application/x-www-form-urlencoded"}))
    HTTP_CASES.append(HttpCase(f"{route}-too-large", method, path,
                               b'{"c": "' + b"x" * rules.MAX_REQUEST + b'"}', 413, "too large"))

HTTP_CASES += [HttpCase(f"purge-body-{kind}", "POST", f"/API/v1/queues/{Q}/purge", raw,
                        status, names)                   # (an empty body purges: optional)
               for kind, raw, status, names in RAW_BODIES if kind != "empty"]
# Paths and queries.
HTTP_CASES += [HttpCase(f"path-id-{kind}", method, f"{MSG}/{mid}{tail}", body, 422, "path.id")
               for kind, mid in (("letters", "abc"), ("negative", "-1"),
                                 ("past-uint64", str(2 ** 64)), ("float", "1.5"))
               for method, tail, body in (("GET", "", None), ("DELETE", "", None),
                                          ("POST", "/ack", None), ("POST", "/touch", None),
                                          ("GET", "/explain", None))]
HTTP_CASES += [
    HttpCase("path-name-too-long", "GET", "/API/v1/queues/" + "n" * (rules.MAX_NAME + 1),
             None, 422, "path.queue_name"),
    HttpCase("path-name-surrogate", "GET", "/API/v1/queues/%ED%BF%BF", None, 400,
             "not valid UTF-8"),
    HttpCase("path-name-surrogate-enqueue", "POST", f"/API/v1/queues/{Q}%ED%A0%80/messages",
             json.dumps(ENQUEUE).encode(), 400, "not valid UTF-8"),
    HttpCase("path-name-latin-1", "DELETE", f"/API/v1/queues/{Q}%E9", None, 400,
             "not valid UTF-8"),
]
HTTP_CASES += [HttpCase(f"query-{name}-{kind}", "GET", f"{MSG}?{name}={value}", None, 422,
                        f"query.{name}")
               for name, values in (("ack", ("maybe", "2", "yes")),
                                    # these fell through to a dequeue
                                    ("browse", ("yes", "on", "y", "True%20", "2")),
                                    ("count", ("0", "1001", "x", "-1", "1.5")),
                                    ("wait", ("-1", "21", "x", "nan", "inf")))
               for kind, value in ((v or "empty", v) for v in values)]
# Consumer names: a dequeue that names a consumer no rule allows takes nothing.
HTTP_CASES += [HttpCase(f"query-consumer-{kind}", "GET", f"{MSG}?ack=false&consumer={value}",
                        None, 422, "query.consumer")
               for kind, value in (("too-long", "c" * (rules.MAX_CONSUMER + 1)),
                                   ("too-many-bytes", "%C3%A9" * (rules.MAX_CONSUMER // 2 + 1)),
                                   ("newline", "a%0Ab"), ("nul", "a%00b"), ("blank", "%20%20"),
                                   ("del", "a%7F"))]
HTTP_CASES += [
    HttpCase("servers-local-yes", "GET", "/API/v1/cluster/servers?local=yes", None, 422,
             "query.local"),
    HttpCase("unknown-queue-dequeue", "GET", "/API/v1/queues/nope/messages", None, 400,
             "Failed to get a queue: nope"),
    HttpCase("unknown-queue-enqueue", "POST", "/API/v1/queues/nope/messages",
             json.dumps(ENQUEUE).encode(), 409, "Failed to get a queue: nope"),
    HttpCase("unknown-message-get", "GET", f"{MSG}/12345", None, 400,
             "Failed to get a message from a queue: victim"),
    HttpCase("ack-a-ready-message", "POST", f"{MSG}/{R}/ack", None, 400, "victim"),
    HttpCase("unknown-route", "POST", "/API/v2/queues", b"{}", 404, "Not Found"),
    # a GET on a path no route matches was answered 200 with the web UI's page
    HttpCase("unknown-api-get", "GET", "/API/v1/nope", None, 404, "Not Found"),
    HttpCase("unknown-queue-subpath-get", "GET", f"/API/v1/queues/{Q}/nope", None, 404,
             "Not Found"),
    HttpCase("unknown-internal-get", "GET", "/internal/nope", None, 404, "Not Found"),
    HttpCase("unknown-db-get", "GET", "/db/nope", None, 404, "Not Found"),
    HttpCase("unknown-page-get", "GET", "/nope", None, 404, "Not Found"),
    HttpCase("wrong-method", "PATCH", f"/API/v1/queues/{Q}", b"{}", 405, "Method Not Allowed"),
]


# Schedules: definitions that cannot be accepted, cron strings that are not cron, names.
SCHED = f"/API/v1/queues/{Q}/schedules"
SCHEDULE_EVERY = {"name": "c", "every": 60, "message": {"content": "x"}}
SCHEDULE_CRON = {"name": "c", "cron": "0 3 * * *", "message": {"content": "x"}}
NOT_CRON = {"empty": "", "three-fields": "* * *", "six-fields": "* * * * * *",
            "seven-fields": "0 0 0 * * * 2030", "minute-61": "61 * * * *",
            "step-zero": "*/0 * * * *", "words": "every five minutes please",
            "feb-30": "0 0 30 2 *", "weekday-8": "0 0 * * 8", "random": "R * * * *",
            "hashed": "H * * * *", "alias-reboot": "@reboot", "alias-unknown": "@often",
            "non-ascii": "\u00e9 * * * *", "newline": "* * * * *\n* * * * *",
            "too-long": "1," * 101 + "1 * * * *", "nul": "0\x00 * * * *",
            "surrogate": SURROGATE + " * * * *"}
HTTP_CASES += field_cases("schedule", "POST", SCHED, SCHEDULE_CRON, {
    "cron": {**NOT_STRING, **NOT_CRON},
    "timezone": {**NOT_STRING, "unknown": "Mars/Olympus", "traversal": "../../etc/passwd",
                 "absolute": "/etc/localtime", "lowercase-utc": "utc", "space": "UTC ",
                 "too-long": "A/" * 40, "host-zone": "localtime", "posixrules": "posixrules",
                 "factory": "Factory", "right": "right/UTC", "posix": "posix/Europe/Berlin"},
    "name": {**NOT_STRING, "empty": "", "space": "a b", "slash": "a/b", "leading-dash": "-a",
             "too-long": "n" * 201, "non-ascii": "na\u00efve", "nul": "a\x00b"},
    "catch_up": {**NOT_STRING, "most": "most", "upper": "ALL"},
    "grace": {**NOT_INT, "zero": 0, "too-big": 86_401},
    "start_at": {**NOT_INT, "past-9999": 253_402_300_800, "huge": 2 ** 64},
    "end_at": {"negative": -1, "past-9999": 253_402_300_800},
    "paused": {"string": "yes", "int": 1, "null": None},
    "message": {"string": "x", "list": [], "null": None},
})
HTTP_CASES += field_cases("schedule", "POST", SCHED, SCHEDULE_EVERY, {
    "every": {**NOT_INT, "zero": 0, "past-a-year": 366 * 86400 + 1, "huge": 2 ** 63,
              "subnormal": 5e-324, "inf-like": 1e308},
})
HTTP_CASES += field_cases("schedule-message", "POST", SCHED, SCHEDULE_EVERY, {
    "message": {f"{field}-{kind}": {"content": "x", field: value}
                for field, values in (("priority", PRIORITY_BROKEN),
                                      ("metadata", {**METADATA_BROKEN,
                                                    "reserved-schedule": {"x-schedule": "f"},
                                                    "reserved-at": {"x-scheduled-at": "0"}}),
                                      ("group", {"dotdot": "..", "int": 5}),
                                      ("ttl", {"negative": -1, "too-long": rules.MAX_TTL + 1}),
                                      ("colour", {"unknown": 1}))
                for kind, value in values.items()}})
HTTP_CASES += [
    body_case("schedule-both", "POST", SCHED, {**SCHEDULE_CRON, "every": 5}, "body.cron"),
    body_case("schedule-neither", "POST", SCHED, {"name": "c", "message": {"content": "x"}},
              "body.cron"),
    body_case("schedule-no-message", "POST", SCHED, {"name": "c", "every": 5},
              "required property message"),
    body_case("schedule-no-content", "POST", SCHED, {"name": "c", "every": 5, "message": {}},
              "required property content"),
    body_case("schedule-end-before-start", "POST", SCHED,
              {**SCHEDULE_EVERY, "start_at": 2_000_000_000, "end_at": 1_999_999_999},
              "body.end_at"),
    body_case("schedule-timezone-with-every", "POST", SCHED,
              {**SCHEDULE_EVERY, "timezone": "UTC"}, "body.timezone"),
    body_case("schedule-unknown-property", "POST", SCHED, {**SCHEDULE_EVERY, "cronn": "x"},
              "body.cronn"),
    body_case("schedule-unknown-queue", "POST", "/API/v1/queues/nope/schedules",
              SCHEDULE_EVERY, "nope", 400),
]
HTTP_CASES += [HttpCase(f"schedule-path-{verb.lower()}-{kind}", verb, f"{SCHED}/{name}{tail}",
                        b"{}" if verb == "POST" else None, status, says)
               for verb, tail in (("GET", ""), ("DELETE", ""), ("POST", "/pause"),
                                  ("POST", "/resume"))
               for kind, name, status, says in (("space", "a%20b", 422, "path.name"),
                                                ("dash", "-x", 422, "path.name"),
                                                ("unknown", "nope", 404, "no schedule"))]


def problem_text(body: dict[str, Any]) -> str:
    parts = [str(body.get("detail", ""))]
    for error in body.get("errors") or []:
        parts += [str(error.get("location", "")), str(error.get("message", ""))]
    return " | ".join(parts)


@pytest.mark.parametrize("case", HTTP_CASES, ids=[c.id for c in HTTP_CASES])
def test_http(victim: Victim, case: HttpCase) -> None:
    before = victim.digest()
    raw = case.raw
    if raw is not None and (b"{ready}" in raw or b"{unacked}" in raw):
        raw = victim.fill(raw.decode()).encode()
    headers = dict(case.headers) if raw is not None else {}
    resp = victim.http.request(case.method, victim.fill(case.path), raw=raw, headers=headers)
    assert resp.status == case.status, (resp.status, resp.body[:400])
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = json.loads(resp.body)
    assert body["status"] == case.status and body["code"]
    assert case.names in problem_text(body), problem_text(body)[:400]
    assert victim.digest() == before


# == gRPC ======================================================================================
@dataclass(frozen=True)
class GrpcCase:
    id: str
    call: Callable[[Victim], Any]
    code: grpc.StatusCode
    names: str


SC = grpc.StatusCode


def rpc(method: str, **fields: Any) -> Callable[[Victim], Any]:
    def filled(v: Victim, x: Any, key: str) -> Any:
        if isinstance(x, list):
            return [filled(v, item, key) for item in x]
        if isinstance(x, str) and x in (R, U) and key in ("id", "ids"):
            return int(v.fill(x))
        return v.fill(x) if isinstance(x, str) else x

    def call(v: Victim) -> Any:
        kind = pb.DESCRIPTOR.services_by_name["DOQ"].methods_by_name[method].input_type.name
        request = getattr(pb, kind)(**{k: filled(v, x, k) for k, x in fields.items()})
        return getattr(v.stub, method)(request, timeout=10)
    return call


QUEUE_RPCS = {"GetQueue": "name", "DeleteQueue": "name", "Dequeue": "queueName",
              "Get": "queueName", "Delete": "queueName", "Ack": "queueName",
              "Nack": "queueName", "Touch": "queueName", "UpdatePriority": "queueName",
              "AckBatch": "queueName", "Enqueue": "queueName", "PurgeQueue": "queueName",
              "PauseQueue": "queueName", "ResumeQueue": "queueName",
              "PauseGroup": "queueName", "ResumeGroup": "queueName",
              "GetGroups": "queueName", "BrowseMessages": "queueName",
              "ExplainMessage": "queueName", "PutSchedule": "queueName",
              "GetSchedules": "queueName"}
ID_RPCS = ["Get", "Delete", "Ack", "Nack", "Touch", "UpdatePriority", "ExplainMessage"]
GRPC_CASES: list[GrpcCase] = []
for method, name_field in QUEUE_RPCS.items():
    extra: dict[str, Any] = {"id": 1} if method in ID_RPCS else {}
    extra |= {"ids": [1]} if method == "AckBatch" else {}
    extra |= {"group": "g"} if method in ("PauseGroup", "ResumeGroup") else {}
    for kind, value, text in (("empty", "", "is required"), ("slash", "a/b", "'/'"),
                              ("too-long", "n" * (rules.MAX_NAME + 1), "is longer than")):
        GRPC_CASES.append(GrpcCase(f"{method}-name-{kind}",
                                   rpc(method, **{name_field: value}, **extra),
                                   SC.INVALID_ARGUMENT, f"{name_field} {text}"
                                   if kind != "slash" else text))
for method in ID_RPCS:
    GRPC_CASES.append(GrpcCase(f"{method}-id-zero", rpc(method, queueName=Q, id=0),
                               SC.INVALID_ARGUMENT, "id is required"))
for kind, name in LABELS_BROKEN.items():
    GRPC_CASES.append(GrpcCase(f"CreateQueue-name-{kind}", rpc(
        "CreateQueue", name=name, type="fair", settings=pb.QueueSettings()),
        SC.INVALID_ARGUMENT, "name "))
    GRPC_CASES.append(GrpcCase(f"Enqueue-group-{kind}", rpc(
        "Enqueue", queueName=Q, content="x", priority=1, group=name),
        SC.INVALID_ARGUMENT, "group "))
for kind, label in {**LABELS_BROKEN, "empty": ""}.items():
    for method in ("PauseGroup", "ResumeGroup"):
        GRPC_CASES.append(GrpcCase(f"{method}-group-{kind}", rpc(
            method, queueName=Q, group=label), SC.INVALID_ARGUMENT, "group"))
GRPC_CASES += [
    GrpcCase("BrowseMessages-state", rpc("BrowseMessages", queueName=Q, state="some"),
             SC.INVALID_ARGUMENT, "state"),
    GrpcCase("BrowseMessages-limit", rpc("BrowseMessages", queueName=Q, limit=1001),
             SC.INVALID_ARGUMENT, "limit"),
    GrpcCase("BrowseMessages-after-gone", rpc("BrowseMessages", queueName=Q, state="ready",
                                              after=12345), SC.INVALID_ARGUMENT, "after"),
    GrpcCase("BrowseMessages-group", rpc("BrowseMessages", queueName=Q, group=".."),
             SC.INVALID_ARGUMENT, "group"),
    GrpcCase("ExplainMessage-unknown", rpc("ExplainMessage", queueName=Q, id=12345),
             SC.NOT_FOUND, "victim"),
    GrpcCase("UpdateQueue-group-rate", rpc("UpdateQueue", name=Q, settings=pb.QueueSettings(
        group_rate=-1)), SC.INVALID_ARGUMENT, "group_rate"),
    GrpcCase("UpdateQueue-group-burst", rpc("UpdateQueue", name=Q, settings=pb.QueueSettings(
        group_burst=0)), SC.INVALID_ARGUMENT, "group_burst"),
    # a rate whose interval does not fit; one priority and id rule on both transports
    GrpcCase("UpdateQueue-group-rate-subnormal", rpc("UpdateQueue", name=Q, settings=pb.
             QueueSettings(group_rate=5e-324)), SC.INVALID_ARGUMENT, "settings.group_rate"),
    GrpcCase("CreateQueue-group-rate-too-slow", rpc("CreateQueue", name=NEW, type="fair",
             settings=pb.QueueSettings(group_rate=1e-13)), SC.INVALID_ARGUMENT,
             "settings.group_rate"),
    GrpcCase("Enqueue-priority-negative", rpc("Enqueue", queueName=Q, content="x",
                                              priority=-1), SC.INVALID_ARGUMENT, "priority"),
    GrpcCase("Enqueue-id-past-int63", rpc("Enqueue", queueName=Q, content="x", priority=1,
                                          id=2 ** 63), SC.INVALID_ARGUMENT, "id must be at most"),
    GrpcCase("EnqueueBatch-priority-negative", rpc("EnqueueBatch", messages=[
        pb.EnqueueRequest(queueName=Q, content="x", priority=1),
        pb.EnqueueRequest(queueName=Q, content="x", priority=-(2 ** 63))]),
        SC.INVALID_ARGUMENT, "messages[1].priority"),
    GrpcCase("UpdatePriority-negative", rpc("UpdatePriority", queueName=Q, id=R, priority=-5),
             SC.INVALID_ARGUMENT, "priority"),
    GrpcCase("Nack-priority-negative", rpc("Nack", queueName=Q, id=U, priority=-1),
             SC.INVALID_ARGUMENT, "priority"),
]
# Delivery tokens
for method in ("Ack", "Nack", "Touch", "Reject"):
    GRPC_CASES += [GrpcCase(f"{method}-delivery-{kind}", rpc(
        method, queueName=Q, id=U, delivery=value), SC.INVALID_ARGUMENT, "delivery")
        for kind, value in DELIVERY_BROKEN.items()
        if isinstance(value, str) and kind not in STRINGS_BROKEN]   # protobuf refuses those
    GRPC_CASES.append(GrpcCase(f"{method}-delivery-stale", rpc(
        method, queueName=Q, id=U, delivery=f"{U}-1-5"), SC.FAILED_PRECONDITION,
        "stale delivery"))
    for token in ("", "999999-1-5"):                 # never existed: not found, token or not
        GRPC_CASES.append(GrpcCase(f"{method}-never-existed{'-with-token' * bool(token)}",
                                   rpc(method, queueName=Q, id=999999, delivery=token),
                                   SC.FAILED_PRECONDITION, "Message not found"))
GRPC_CASES += [GrpcCase(f"{method}-consumer-{kind}", rpc(method, queueName=Q, consumer=value),
                        SC.INVALID_ARGUMENT, "consumer")
               for method in ("Dequeue",)
               for kind, value in (("too-long", "c" * (rules.MAX_CONSUMER + 1)),
                                   ("newline", "a\nb"), ("blank", "  "), ("c1", "a\x85"))]
GRPC_CASES += [GrpcCase(f"Reject-reason-{kind}", rpc("Reject", queueName=Q, id=U, reason=value),
                        SC.INVALID_ARGUMENT, "reason: expected one of")
               for kind, value in (("unknown", "bored"), ("upper", "REJECTED"),
                                   ("dead-reason", "max_deliveries"))]
for method in ("Ack", "Nack", "Reject"):
    GRPC_CASES += [GrpcCase(f"{method}-enqueue-{kind}", rpc(method, queueName=Q, id=U,
                                                            enqueue=items), code, says)
                   for kind, items, code, says in (
                       ("too-many", [pb.EnqueueRequest(queueName=Q, content="r",
                                                       priority=1)] * 101,
                        SC.INVALID_ARGUMENT, "at most 100"),
                       ("no-queue", [pb.EnqueueRequest(content="r", priority=1)],
                        SC.INVALID_ARGUMENT, "enqueue[0].queueName"),
                       ("priority-negative", [pb.EnqueueRequest(queueName=Q, content="r",
                                                                priority=-1)],
                        SC.INVALID_ARGUMENT, "enqueue[0].priority"),
                       ("unknown-queue", [pb.EnqueueRequest(queueName="nope", content="r",
                                                            priority=1)],
                        SC.NOT_FOUND, "nope"))]
GOOD_ITEM = pb.EnqueueRequest(queueName=Q, content="r", priority=1)
GRPC_CASES += [GrpcCase(f"{method}-delay-past-30-days", call, SC.INVALID_ARGUMENT, says)
               for method, call, says in (
                   ("Enqueue", rpc("Enqueue", queueName=Q, content="x", priority=1,
                                   delay=rules.MAX_DELAY + 1), "delay"),
                   ("EnqueueBatch", rpc("EnqueueBatch", messages=[pb.EnqueueRequest(
                       queueName=Q, content="x", priority=1, delay=rules.MAX_DELAY + 1)]),
                    "messages[0].delay"),
                   ("Ack", rpc("Ack", queueName=Q, id=U, enqueue=[pb.EnqueueRequest(
                       queueName=Q, content="x", priority=1, delay=rules.MAX_DELAY + 1)]),
                    "enqueue[0].delay"))]
GRPC_CASES += [GrpcCase(f"AckBatch-enqueue-{kind}", rpc("AckBatch", queueName=Q, ids=ids,
                                                        enqueue=lists), SC.INVALID_ARGUMENT,
                        says)
               for kind, ids, lists, says in (
                   ("more-lists-than-ids", [U], [pb.SettleEnqueue()] * 2, "one list"),
                   ("too-many-for-one", [U], [pb.SettleEnqueue(messages=[GOOD_ITEM] * 101)],
                    "at most 100"),
                   ("too-many-in-all", [U] + list(range(1, 11)),
                    [pb.SettleEnqueue(messages=[GOOD_ITEM] * 100)] * 11, "at most 1000"),
                   ("no-queue", [U], [pb.SettleEnqueue(messages=[
                       pb.EnqueueRequest(content="r", priority=1)])],
                    "enqueue[0].messages[0].queueName"),
                   ("priority-negative", [U], [pb.SettleEnqueue(messages=[
                       pb.EnqueueRequest(queueName=Q, content="r", priority=-1)])],
                    "enqueue[0].messages[0].priority"))]
GRPC_CASES += [
    GrpcCase("AckBatch-deliveries-count", rpc("AckBatch", queueName=Q, ids=[U],
                                               deliveries=[f"{U}-1-5", f"{U}-1-5"]),
             SC.INVALID_ARGUMENT, "one per id"),
    GrpcCase("AckBatch-deliveries-garbage", rpc("AckBatch", queueName=Q, ids=[U],
                                                 deliveries=["abc"]),
             SC.INVALID_ARGUMENT, "deliveries[0]"),
    GrpcCase("AckBatch-deliveries-another-message", rpc(
        "AckBatch", queueName=Q, ids=[U], deliveries=[f"{R}-1-5"]), SC.INVALID_ARGUMENT,
        "not of message"),
]
GRPC_CASES += [
    GrpcCase("CreateQueue-type", rpc("CreateQueue", name=NEW, type="lifo",
                                     settings=pb.QueueSettings()), SC.INVALID_ARGUMENT, "type"),
    GrpcCase("CreateQueue-no-settings", rpc("CreateQueue", name=NEW, type="fair"),
             SC.INVALID_ARGUMENT, "settings"),
    GrpcCase("CreateQueue-ack-timeout", rpc("CreateQueue", name=NEW, type="fair",
                                            settings=pb.QueueSettings(ack_timeout=5)),
             SC.INVALID_ARGUMENT, "ack_timeout"),
    GrpcCase("CreateQueue-strategy", rpc("CreateQueue", name=NEW, type="fair",
                                         settings=pb.QueueSettings(strategy=9)),
             SC.INVALID_ARGUMENT, "strategy"),
    GrpcCase("UpdateQueue-ack-timeout", rpc("UpdateQueue", name=Q,
                                            settings=pb.QueueSettings(ack_timeout=9)),
             SC.INVALID_ARGUMENT, "ack_timeout"),
    GrpcCase("GenerateIDs-zero", rpc("GenerateIDs", number=0), SC.INVALID_ARGUMENT, "number"),
    GrpcCase("GenerateIDs-1001", rpc("GenerateIDs", number=1001), SC.INVALID_ARGUMENT,
             "number"),
    GrpcCase("AckBatch-zero-id", rpc("AckBatch", queueName=Q, ids=[0]), SC.INVALID_ARGUMENT,
             "ids"),
    GrpcCase("AckBatch-too-many", rpc("AckBatch", queueName=Q, ids=list(range(1, 10_002))),
             SC.INVALID_ARGUMENT, "ids per call"),
    GrpcCase("EnqueueBatch-empty", rpc("EnqueueBatch"), SC.INVALID_ARGUMENT, "messages"),
    GrpcCase("Enqueue-unknown-queue", rpc("Enqueue", queueName="nope", content="x",
                                          priority=1), SC.NOT_FOUND, "nope"),
    GrpcCase("Ack-a-ready-message", rpc("Ack", queueName=Q, id=R), SC.FAILED_PRECONDITION,
             ""),
    GrpcCase("Enqueue-too-large", rpc("Enqueue", queueName=Q, content="x" * rules.MAX_REQUEST,
                                      priority=1), SC.RESOURCE_EXHAUSTED, ""),
]
GRPC_CASES += [GrpcCase(f"Enqueue-metadata-{kind}", rpc(
    "Enqueue", queueName=Q, content="x", priority=1, metadata=value), SC.INVALID_ARGUMENT,
    "metadata") for kind, value in METADATA_BROKEN.items()
    if all(isinstance(k, str) and isinstance(v, str) and "\udfff" not in k + v
           for k, v in (value.items() if isinstance(value, dict) else [(1, 1)]))]
GRPC_CASES += [GrpcCase(f"Enqueue-group-{kind}", rpc(
    "Enqueue", queueName=Q, content="x", priority=1, group=group), SC.INVALID_ARGUMENT,
    "group") for kind, group in (
        ("too-deep", ".".join(["l"] * (rules.MAX_GROUP_DEPTH + 1))),
        ("too-many-bytes", "é" * (rules.MAX_GROUP // 2 + 1)), ("empty-label", "a..b"))]
GRPC_CASES += [GrpcCase(f"EnqueueBatch-item-{kind}", rpc("EnqueueBatch", messages=[
    pb.EnqueueRequest(queueName=Q, content="x", priority=1),
    pb.EnqueueRequest(**{"queueName": Q, "content": "x", "priority": 1, **fields})]),
    SC.INVALID_ARGUMENT, "messages[1].") for kind, fields in (
        ("group", {"group": ".."}), ("metadata", {"metadata": {"": "v"}}),
        ("name", {"queueName": ""}))]


# Schedules
GOOD_MESSAGE = pb.ScheduleMessage(content="x")
GRPC_CASES += [GrpcCase(f"PutSchedule-{kind}", rpc("PutSchedule", queueName=Q,
                                                   schedule=definition), SC.INVALID_ARGUMENT,
                        says)
               for kind, definition, says in [
                   *((f"cron-{k}", pb.ScheduleDefinition(name="c", cron=v, message=GOOD_MESSAGE),
                      "cron") for k, v in NOT_CRON.items() if k != "surrogate"),
                   ("every-negative", pb.ScheduleDefinition(name="c", every=-5,
                                                            message=GOOD_MESSAGE), "every"),
                   ("every-past-a-year", pb.ScheduleDefinition(name="c", every=366 * 86400 + 1,
                                                               message=GOOD_MESSAGE), "every"),
                   ("both", pb.ScheduleDefinition(name="c", every=5, cron="* * * * *",
                                                  message=GOOD_MESSAGE), "cron"),
                   ("timezone-unknown", pb.ScheduleDefinition(
                       name="c", cron="* * * * *", timezone="Nowhere/Land",
                       message=GOOD_MESSAGE), "timezone"),
                   ("name-empty", pb.ScheduleDefinition(every=5, message=GOOD_MESSAGE), "name"),
                   ("name-slash", pb.ScheduleDefinition(name="a/b", every=5,
                                                        message=GOOD_MESSAGE), "name"),
                   ("catch-up", pb.ScheduleDefinition(name="c", every=5, catch_up="most",
                                                      message=GOOD_MESSAGE), "catch_up"),
                   ("grace-negative", pb.ScheduleDefinition(name="c", every=5, grace=-1,
                                                            message=GOOD_MESSAGE), "grace"),
                   ("start-negative", pb.ScheduleDefinition(name="c", every=5, start_at=-1,
                                                            message=GOOD_MESSAGE), "start_at"),
                   ("end-past-9999", pb.ScheduleDefinition(name="c", every=5,
                                                           end_at=253_402_300_800,
                                                           message=GOOD_MESSAGE), "end_at"),
                   ("priority-negative", pb.ScheduleDefinition(
                       name="c", every=5, message=pb.ScheduleMessage(content="x", priority=-1)),
                    "priority"),
                   ("metadata-reserved", pb.ScheduleDefinition(
                       name="c", every=5, message=pb.ScheduleMessage(
                           content="x", metadata={"x-scheduled-at": "0"})), "metadata"),
                   ("group-dotdot", pb.ScheduleDefinition(
                       name="c", every=5, message=pb.ScheduleMessage(content="x", group="..")),
                    "group"),
                   ("ttl-negative", pb.ScheduleDefinition(
                       name="c", every=5, message=pb.ScheduleMessage(content="x", ttl=-1)),
                    "ttl")]]
GRPC_CASES += [GrpcCase(f"{method}-{kind}", rpc(method, queueName=Q, name=name), code, says)
               for method in ("DeleteSchedule", "PauseSchedule", "ResumeSchedule")
               for kind, name, code, says in (("name-empty", "", SC.INVALID_ARGUMENT, "name"),
                                              ("name-space", "a b", SC.INVALID_ARGUMENT, "name"),
                                              ("unknown", "nope", SC.NOT_FOUND, "no schedule"))]
GRPC_CASES += [GrpcCase("GetSchedules-name-space", rpc("GetSchedules", queueName=Q, name="a b"),
                        SC.INVALID_ARGUMENT, "name"),
               GrpcCase("GetSchedules-unknown", rpc("GetSchedules", queueName=Q, name="nope"),
                        SC.NOT_FOUND, "no schedule")]


def malformed(method: str, frame: bytes) -> Callable[[Victim], Any]:
    def call(v: Victim) -> Any:
        if method in ("EnqueueStream", "DequeueStream", "EnqueueBatchStream"):
            stream = v.channel.stream_stream(f"/queue.DOQ/{method}")
            return list(stream(iter([frame]), timeout=10))
        return v.channel.unary_unary(f"/queue.DOQ/{method}")(frame, timeout=10)
    return call


FRAMES = {"not-utf8": b"\x0a\x02\xff\xfe", "truncated": b"\x0a\x10abc",
          "endless-varint": b"\x08" + b"\xff" * 11}
for method, descriptor in pb.DESCRIPTOR.services_by_name["DOQ"].methods_by_name.items():
    first = descriptor.input_type.fields_by_number.get(1)
    for kind, frame in FRAMES.items():
        if kind == "not-utf8" and (first is None or first.type != first.TYPE_STRING):
            continue                      # elsewhere those bytes are a valid unknown field
        GRPC_CASES.append(GrpcCase(f"{method}-frame-{kind}", malformed(method, frame),
                                   SC.INVALID_ARGUMENT, "malformed request"))


@pytest.mark.parametrize("case", GRPC_CASES, ids=[c.id for c in GRPC_CASES])
def test_grpc(victim: Victim, case: GrpcCase) -> None:
    before = victim.digest()
    with pytest.raises(grpc.RpcError) as info:
        case.call(victim)
    err: Any = info.value
    assert err.code() == case.code, (err.code(), err.details())
    assert case.names in (err.details() or ""), err.details()
    assert victim.digest() == before


# == the Raft port ==============================================================================
def pickle_exploit(marker: str) -> bytes:
    """A pickle that would run ``touch marker`` if a node unpickled it into objects."""
    return f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()


RAFT_BYTES = {
    "http-request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "zeros": b"\x00" * 4096,
    "huge-length": struct.pack(">I", 0xFFFFFFFF) + b"x" * 100,
    "pickle-exploit": b"",                    # built per node: it names a file beside it
    "random": bytes(range(256)) * 16,
    "empty-then-close": b"",
}


@pytest.mark.parametrize("kind", list(RAFT_BYTES))
def test_raft_port(victim: Victim, kind: str) -> None:
    """Bytes that are not a member's handshake: the node drops the connection, answers its
    clients and changes nothing."""
    marker = os.path.join(victim.node.data_dir, "pwned")
    payload = RAFT_BYTES[kind]
    if kind == "pickle-exploit":
        exploit = pickle_exploit(marker)
        payload = struct.pack(">I", len(exploit)) + exploit
    before = victim.digest()
    sock = socket.create_connection(("127.0.0.1", victim.node.raft_port), timeout=10)
    try:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(10)
        while sock.recv(65536):
            pass                                  # until the node closes it
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    assert not os.path.exists(marker)
    assert victim.http.get("/readyz").status == 200
    assert victim.digest() == before


# == backup files ================================================================================
def _schedule_record(qid: int, name: str, change: dict[str, Any]) -> tuple[int, bytes, bytes]:
    """A schedule record of queue ``qid``: a good one, with ``change`` in its definition
    (a key of the state itself when it is not one of the definition's)."""
    defn = schedules.define(name, {"content": "x"}, 0, cron="0 3 * * *").to_json()
    state: dict[str, Any] = {"paused": False, "next_ms": 1, "last_ms": 0, "fired": 0,
                             "skipped": 0, "refused": 0, "last_error": "", "created_ms": 0}
    for key, value in change.items():
        (defn if key in defn else state)[key] = value
    return 10, U64.pack(qid) + name.encode(), json.dumps({"def": defn, **state}).encode()


GOOD_QUEUE = _queue_record("restored", 1)
BACKUP_FILES: list[tuple[str, bytes, str]] = [
    ("empty", b"", "empty"),
    ("garbage", b"\x00" * 64, "not a DOQ backup file"),
    ("text", b"hello, this is not a backup\n", "not a DOQ backup file"),
    ("json", json.dumps({"queues": []}).encode(), "not a DOQ backup file"),
    ("truncated-header", forge({}, [GOOD_QUEUE])[:12], "truncated"),
    ("truncated-records", forge({}, [GOOD_QUEUE])[:-5], ""),
    ("flipped-byte", (lambda b: b[:-3] + bytes([b[-3] ^ 0xFF]) + b[-2:])(
        forge({}, [GOOD_QUEUE])), "damaged"),
    ("format-9", forge({"format": 9}, []), "format 9 is not supported"),
    ("last-id-huge", forge({"last_id": 2 ** 64 - 1}, []), "last_id is out of range"),
    ("next-qid-zero", forge({"next_qid": 0}, []), "next_qid"),
    ("kind-unknown", forge({"kind": "partial"}, []), ""),
    ("orphan-message", forge({}, [_message_record(7, 1)]), "belongs to no queue"),
    ("undecodable-message", forge({}, [GOOD_QUEUE, _message_record(1, 5, b"\x00\x01")]),
     "cannot be read"),
    ("queue-name-slash", forge({}, [_queue_record("a/b", 1)]), "queue name"),
    ("queue-name-empty", forge({}, [_queue_record("", 1)]), "bad record"),
    ("message-id-zero", forge({}, [GOOD_QUEUE, _message_record(1, 0)]), "id 0"),
    *((f"schedule-{kind}", forge({}, [GOOD_QUEUE, _schedule_record(1, "s", change)]),
       "schedule 's'") for kind, change in (
        ("cron-random", {"cron": "R * * * *"}), ("zone-unknown", {"timezone": "Nowhere/X"}),
        ("other-name", {"name": "t"}), ("grace-zero", {"grace": 0}),
        ("message-reserved", {"message": {"content": "x", "metadata": {"x-schedule": "f"}}}),
        ("time-negative", {"start_ms": -1}), ("state-count", {"fired": -1}))),
    ("schedule-orphan", forge({}, [_schedule_record(7, "s", {})]), "belongs to no queue"),
    ("schedule-not-json", forge({}, [GOOD_QUEUE, (10, U64.pack(1) + b"s", b"{")]),
     "cannot be read"),
]


@pytest.mark.parametrize(("kind", "data", "names"), BACKUP_FILES,
                         ids=[b[0] for b in BACKUP_FILES])
def test_backup_file(victim: Victim, kind: str, data: bytes, names: str) -> None:
    before = victim.digest()
    resp = victim.http.request("POST", "/db/restore", raw=data,
                               headers={"Content-Type": "application/octet-stream"})
    assert resp.status == 400, (resp.status, resp.body[:400])
    body = json.loads(resp.body)
    assert body["detail"] in ("invalid backup file", "request body is required"), body
    assert names in problem_text(body), problem_text(body)[:400]
    assert victim.digest() == before


def test_refusals_leave_one_line_at_most_never_a_traceback(victim: Victim) -> None:
    """a garbage restore upload logged a traceback (gevent printed the worker's
    exception before the API answered 400); so did a browse or explain that was refused
    in the writer thread."""
    with open(victim.node.log_path, "rb") as f:
        before = len(f.read())
    for raw in (b"garbage" * 50, b"DOQBACKUP\n\x01\x00\x00\x00\x05{}}}}", b""):
        r = victim.http.request("POST", "/db/restore", raw=raw,
                                headers={"Content-Type": "application/octet-stream"})
        assert r.status == 400, r.body
    assert victim.http.get(f"{MSG}/12345/explain").status == 400
    assert victim.http.get(f"{MSG}?browse=true&state=ready&after=12345").status == 422
    assert victim.http.post("/db/backup", {"since": 2 ** 62}).status == 422
    with open(victim.node.log_path, "rb") as f:
        log = f.read()[before:].decode(errors="replace")
    assert "Traceback" not in log, log[:3000]


def test_the_corpus_has_at_least_300_cases() -> None:
    total = len(HTTP_CASES) + len(GRPC_CASES) + len(RAFT_BYTES) + len(BACKUP_FILES)
    assert total >= 300, total


def test_a_reserved_key_in_any_case_is_refused_naming_every_reserved_key(
        victim: Victim) -> None:
    before = victim.digest()
    for key in ("X-DEAD-REASON", "X-Schedule", "x-scheduled-at"):
        raw = json.dumps({"priority": 1, "content": "x", "metadata": {key: "v"}}).encode()
        resp = victim.http.request("POST", victim.fill(MSG), raw=raw,
                                   headers={"Content-Type": "application/json"})
        assert resp.status == 422, resp.body[:300]
        text = problem_text(json.loads(resp.body))
        for reserved in ("x-dead-*", *rules.RESERVED_METADATA, "in any case"):
            assert reserved in text, text
    assert victim.digest() == before


# == gRPC streams ended every way ================================================================
STREAM_WAYS = ("oversized", "compressed", "malformed", "handler_failed", "cancelled",
               "deadline", "unary_oversized")


@pytest.mark.parametrize("way", STREAM_WAYS)
def test_grpc_streams_ended_every_way_stall_nothing(victim: Victim, way: str) -> None:
    """Six streams ended this way on one connection (more than its window would bear if each
    kept 16 KiB of it): the connection still carries a call, and nothing changed."""
    before = victim.digest()
    client = Counting(victim.node, "")
    try:
        run = stream_ways(Keys("", ""))[way]
        for _ in range(6):
            assert run(client) == 0
        assert client.settled() <= BATCH
        still_answers(client)
    finally:
        client.close()
    assert victim.digest() == before
