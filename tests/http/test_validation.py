"""The §3.1 validation table: bodies (empty, unparseable, too large, wrong type), schema rows, path
and query values. Each rejected request is compared with a snapshot of the victim queue: bad input
changes nothing."""
from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest

from doq_lib import rules
from tests.harness import Http, NodeProc
from tests.http.shapes import (
    INT64_MAX,
    MIB,
    Victim,
    counts,
    create,
    dequeue,
    enqueue,
    fill_body,
    get_message,
    info,
    invalid,
    ok,
    problem,
    rejected,
    send_chunked,
    unique,
)

# == §3.1 validation table ========================================================================


# (op id, method, path template, a valid body)
BODY_ROUTES = [
    ("create-queue", "POST", "/API/v1/queues", {"name": "{new}", "type": "fair"}),
    ("update-queue", "PUT", "/API/v1/queues/{q}", {"settings": {"max_unacked": 9}}),
    ("enqueue", "POST", "/API/v1/queues/{q}/messages", {"priority": 1, "content": "x"}),
    ("nack", "POST", "/API/v1/queues/{q}/messages/{u}/nack", {"priority": 3}),
    ("update-priority", "PUT", "/API/v1/queues/{q}/messages/{r}/priority", {"priority": 3}),
    ("generate-id", "POST", "/API/v1/ids", {"number": 2}),
]
BODY_ROUTE_IDS = [r[0] for r in BODY_ROUTES]


def valid_raw(victim: Victim, body: dict[str, Any]) -> bytes:
    return json.dumps(fill_body(victim, body)).encode()


@pytest.mark.parametrize("op,method,path,body", BODY_ROUTES, ids=BODY_ROUTE_IDS)
def test_empty_body_400(http: Http, victim: Victim, op: str, method: str, path: str,
                        body: dict[str, Any]) -> None:
    for raw, headers in ((b"", {"Content-Type": "application/json"}), (b"", {}),
                         (b"  \n", {"Content-Type": "application/json"})):
        out = problem(rejected(http, victim, method, path, raw=raw, headers=headers), 400,
                      "request body is required")
        assert "errors" not in out


@pytest.mark.parametrize("op,method,path,body", BODY_ROUTES, ids=BODY_ROUTE_IDS)
def test_unparseable_json_400(http: Http, victim: Victim, op: str, method: str, path: str,
                              body: dict[str, Any]) -> None:
    raw = valid_raw(victim, body)[:-1]            # truncated: the closing brace is missing
    out = problem(rejected(http, victim, method, path, raw=raw,
                           headers={"Content-Type": "application/json"}), 400,
                  "validation failed")
    assert len(out["errors"]) == 1 and out["errors"][0]["location"] == "body"
    assert out["errors"][0]["value"] == raw.decode() and out["errors"][0]["message"]


@pytest.mark.parametrize("op,method,path,body", BODY_ROUTES, ids=BODY_ROUTE_IDS)
def test_unsupported_content_type_415(http: Http, victim: Victim, op: str, method: str,
                                      path: str, body: dict[str, Any]) -> None:
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "text/json"):
        out = problem(rejected(http, victim, method, path, raw=valid_raw(victim, body),
                               headers={"Content-Type": ctype}), 415, "validation failed")
        assert len(out["errors"]) == 1


@pytest.mark.parametrize("op,method,path,body", BODY_ROUTES, ids=BODY_ROUTE_IDS)
def test_body_too_large_413(http: Http, victim: Victim, op: str, method: str, path: str,
                            body: dict[str, Any]) -> None:
    raw = valid_raw(victim, body)
    at_limit = raw + b" " * (MIB - len(raw))
    assert len(at_limit) == MIB
    problem(rejected(http, victim, method, path, raw=at_limit,
                     headers={"Content-Type": "application/json"}), 413,
            "request body is too large limit=1048576 bytes")


def test_body_size_boundary_and_chunked(http: Http, node: NodeProc) -> None:
    name = unique("size")
    create(http, name)
    raw = b'{"priority": 1, "content": "x"}'
    below = raw + b" " * (MIB - 1 - len(raw))
    assert ok(http.post(f"/API/v1/queues/{name}/messages", raw=below,
                        headers={"Content-Type": "application/json"}))["status"] == "ENQUEUED"
    # chunked transfer encoding: no Content-Length
    resp = send_chunked(node.http_port, "POST", f"/API/v1/queues/{name}/messages",
                        [b'{"priority": 2, ', b'"content": "chunked"}'])
    assert ok(resp)["content"] == "chunked"
    big = [b" " * 65536] * 16 + [raw]                           # 1 MiB + a valid object
    problem(send_chunked(node.http_port, "POST", f"/API/v1/queues/{name}/messages", big), 413,
            "request body is too large limit=1048576 bytes")
    assert counts(http, name) == (2, 0, 2)


@pytest.mark.parametrize("raw", [
    b"[" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,            # too deep to parse
    b'{"priority": NaN, "content": "x"}', b'{"priority": Infinity, "content": "x"}',
    b'{"priority": -Infinity, "content": "x"}', b'{"priority": 1e400, "content": "x"}',
    b'{"priority": 1, "content": "x"} trailing', b"\xff\xfe{", b"'single quotes'",
], ids=["deep-array", "deep-object", "NaN", "Infinity", "-Infinity", "1e400", "trailing",
        "bad-encoding", "single-quotes"])
def test_hostile_json_400(http: Http, victim: Victim, raw: bytes) -> None:
    out = problem(rejected(http, victim, "POST", "/API/v1/queues/{q}/messages", raw=raw,
                           headers={"Content-Type": "application/json"}), 400,
                  "validation failed")
    assert [e["location"] for e in out["errors"]] == ["body"]


def test_accepted_content_types(http: Http) -> None:
    name = unique("ctype")
    create(http, name)
    raw = b'{"priority": 1, "content": "x"}'
    for headers in ({"Content-Type": "application/json; charset=utf-8"},
                    {"Content-Type": "application/merge-patch+json"},
                    {"Content-Type": "Application/JSON"}):
        ok(http.post(f"/API/v1/queues/{name}/messages", raw=raw, headers=headers))
    assert counts(http, name) == (3, 0, 3)


@pytest.mark.parametrize("headers", [
    {}, {"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"},
    {"Content-Type": "multipart/form-data; boundary=x"}], ids=["none", "text", "form", "multipart"])
def test_a_json_body_must_say_it_is_json(http: Http, headers: dict[str, str]) -> None:
    """a body without Content-Type was parsed as JSON, so a page elsewhere could
    create queues through a visitor's browser with a plain form post."""
    name = unique("form")
    raw = json.dumps({"name": name, "type": "delayed"}).encode()
    resp = http.post("/API/v1/queues", raw=raw, headers=headers)
    out = problem(resp, 415, "validation failed")
    assert out["errors"][0]["location"] == "header.Content-Type"
    assert name not in http.get("/API/v1/queues").body.decode()
    create(http, name)
    mid = enqueue(http, name)["id"]
    dequeue(http, name)
    ok(http.post(f"/API/v1/queues/{name}/messages/{mid}/ack", raw=b"", headers=headers))


# (case id, method, path, body, message, location)
SCHEMA_CASES: list[tuple[str, str, str, Any, str, str]] = [
    # create queue
    ("create-missing-name", "POST", "/API/v1/queues", {"type": "fair"},
     "expected required property name to be present", "body"),
    ("create-missing-type", "POST", "/API/v1/queues", {"name": "{new}"},
     "expected required property type to be present", "body"),
    ("create-name-type", "POST", "/API/v1/queues", {"name": 5, "type": "fair"},
     "expected string", "body.name"),
    ("create-type-enum", "POST", "/API/v1/queues", {"name": "{new}", "type": "lifo"},
     'expected value to be one of "delayed, fair"', "body.type"),
    ("create-type-enum-case", "POST", "/API/v1/queues", {"name": "{new}", "type": "FAIR"},
     'expected value to be one of "delayed, fair"', "body.type"),
    ("create-strategy-upper", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "fair", "settings": {"strategy": "WEIGHTED"}},
     'expected value to be one of "round_robin, weighted"', "body.settings.strategy"),
    ("create-strategy-unknown", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "fair", "settings": {"strategy": "fifo"}},
     'expected value to be one of "round_robin, weighted"', "body.settings.strategy"),
    ("create-strategy-empty", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "fair", "settings": {"strategy": ""}},
     'expected value to be one of "round_robin, weighted"', "body.settings.strategy"),
    ("create-strategy-type", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "fair", "settings": {"strategy": 1}},
     "expected string", "body.settings.strategy"),
    ("create-max-unacked-negative", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "fair", "settings": {"max_unacked": -1}},
     "expected number >= 0", "body.settings.max_unacked"),
    ("create-max-unacked-type", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "fair", "settings": {"max_unacked": "3"}},
     "expected integer", "body.settings.max_unacked"),
    ("create-ack-timeout-59", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "fair", "settings": {"ack_timeout": 59}},
     "expected number >= 60", "body.settings.ack_timeout"),
    ("create-ack-timeout-0", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "delayed", "settings": {"ack_timeout": 0}},
     "expected number >= 60", "body.settings.ack_timeout"),
    ("create-ack-timeout-float", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "delayed", "settings": {"ack_timeout": 60.5}},
     "expected integer", "body.settings.ack_timeout"),
    ("create-settings-type", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "fair", "settings": "x"}, "expected object", "body.settings"),
    ("create-unknown-property", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "fair", "durable": True}, "unexpected property", "body.durable"),
    ("create-unknown-setting", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "fair", "settings": {"weights": {}}},
     "unexpected property", "body.settings.weights"),
    ("create-body-array", "POST", "/API/v1/queues", [], "expected object", "body"),
    ("create-body-null", "POST", "/API/v1/queues", None, "expected object", "body"),
    # update queue
    ("update-missing-settings", "PUT", "/API/v1/queues/{q}", {},
     "expected required property settings to be present", "body"),
    ("update-settings-null", "PUT", "/API/v1/queues/{q}", {"settings": None},
     "expected object", "body.settings"),
    ("update-strategy-upper", "PUT", "/API/v1/queues/{q}",
     {"settings": {"strategy": "ROUND_ROBIN"}},
     'expected value to be one of "round_robin, weighted"', "body.settings.strategy"),
    ("update-ack-timeout-0", "PUT", "/API/v1/queues/{q}", {"settings": {"ack_timeout": 0}},
     "expected number >= 60", "body.settings.ack_timeout"),
    ("update-ack-timeout-59", "PUT", "/API/v1/queues/{q}", {"settings": {"ack_timeout": 59}},
     "expected number >= 60", "body.settings.ack_timeout"),
    ("update-max-unacked-negative", "PUT", "/API/v1/queues/{q}",
     {"settings": {"max_unacked": -1}}, "expected number >= 0", "body.settings.max_unacked"),
    ("update-unknown-property", "PUT", "/API/v1/queues/{q}",
     {"settings": {}, "type": "delayed"}, "unexpected property", "body.type"),
    # enqueue
    ("enqueue-missing-priority", "POST", "/API/v1/queues/{q}/messages", {"content": "x"},
     "expected required property priority to be present", "body"),
    ("enqueue-missing-content", "POST", "/API/v1/queues/{q}/messages", {"priority": 1},
     "expected required property content to be present", "body"),
    ("enqueue-priority-negative", "POST", "/API/v1/queues/{q}/messages",
     {"priority": -1, "content": "x"}, "expected number >= 0", "body.priority"),
    ("enqueue-priority-too-big", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 2 ** 63, "content": "x"}, f"expected number <= {INT64_MAX}", "body.priority"),
    ("enqueue-priority-string", "POST", "/API/v1/queues/{q}/messages",
     {"priority": "1", "content": "x"}, "expected integer", "body.priority"),
    ("enqueue-priority-float", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1.5, "content": "x"}, "expected integer", "body.priority"),
    ("enqueue-priority-bool", "POST", "/API/v1/queues/{q}/messages",
     {"priority": True, "content": "x"}, "expected integer", "body.priority"),
    ("enqueue-content-type", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": {"a": 1}}, "expected string", "body.content"),
    ("enqueue-group-type", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": "x", "group": 5}, "expected string", "body.group"),
    ("enqueue-metadata-value", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": "x", "metadata": {"a": 1}}, "expected string",
     "body.metadata.a"),
    ("enqueue-metadata-type", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": "x", "metadata": ["a"]}, "expected object", "body.metadata"),
    ("enqueue-id-number", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": "x", "id": 5}, "expected string", "body.id"),
    ("enqueue-id-not-decimal", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": "x", "id": "abc"},
     "expected a decimal message id below 2^63", "body.id"),
    ("enqueue-id-negative", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": "x", "id": "-1"},
     "expected a decimal message id below 2^63", "body.id"),
    ("enqueue-id-2^63", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": "x", "id": str(2 ** 63)},
     "expected a decimal message id below 2^63", "body.id"),
    ("enqueue-unknown-property", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": "x", "expiry": 5}, "unexpected property", "body.expiry"),
    ("enqueue-ttl-negative", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": "x", "ttl": -5}, "expected number >= 0", "body.ttl"),
    ("enqueue-dedup-key-long", "POST", "/API/v1/queues/{q}/messages",
     {"priority": 1, "content": "x", "dedup_key": "k" * 300},
     "expected a dedup key of at most 256 bytes of valid Unicode (longer than 256 bytes)",
     "body.dedup_key"),
    # nack (of the unacked message)
    ("nack-delivery-garbage", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"delivery": "abc"}, "expected a delivery token as answered with the message",
     "body.delivery"),
    ("nack-delivery-number", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"delivery": 5}, "expected string", "body.delivery"),
    ("nack-delivery-long", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"delivery": "1" * 65}, "expected length <= 64", "body.delivery"),
    ("reject-delivery-garbage", "POST", "/API/v1/queues/{q}/messages/{u}/reject",
     {"delivery": "1-0-5"}, "expected a delivery token as answered with the message",
     "body.delivery"),
    ("ack-delivery-garbage", "POST", "/API/v1/queues/{q}/messages/{u}/ack",
     {"delivery": "1-2"}, "expected a delivery token as answered with the message",
     "body.delivery"),
    ("touch-delivery-garbage", "POST", "/API/v1/queues/{q}/messages/{u}/touch",
     {"delivery": ""}, "expected a delivery token as answered with the message",
     "body.delivery"),
    ("ack-batch-delivery-garbage", "POST", "/API/v1/queues/{q}/messages/ack",
     {"ids": [{"id": "5", "delivery": "x"}]},
     "expected a delivery token as answered with the message", "body.ids[0].delivery"),
    ("ack-batch-object-without-id", "POST", "/API/v1/queues/{q}/messages/ack",
     {"ids": [{"delivery": "1-1-1"}]}, "expected required property id to be present",
     "body.ids[0]"),
    ("nack-batch-delivery-of-another", "POST", "/API/v1/queues/{q}/messages/nack",
     {"ids": [{"id": "5", "delivery": "6-1-1"}]},
     "the delivery token is one of message 6, not of message 5", "body.ids[0].delivery"),
    ("nack-priority-negative", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": -1}, "expected number >= 0", "body.priority"),
    ("nack-priority-string", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": "1"}, "expected integer", "body.priority"),
    ("nack-metadata-value", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": 1, "metadata": {"a": 1}}, "expected string", "body.metadata.a"),
    ("nack-metadata-type", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": 1, "metadata": "x"}, "expected object or null", "body.metadata"),
    ("nack-unknown-property", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": 1, "requeue_after": 5}, "unexpected property", "body.requeue_after"),
    ("nack-delay-too-long", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": 1, "delay": 10 ** 9}, "expected number <= 2592000", "body.delay"),
    ("nack-error-type", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": 1, "error": 7}, "expected string", "body.error"),
    # update priority (of the ready message)
    ("priority-missing", "PUT", "/API/v1/queues/{q}/messages/{r}/priority", {},
     "expected required property priority to be present", "body"),
    ("priority-negative", "PUT", "/API/v1/queues/{q}/messages/{r}/priority", {"priority": -1},
     "expected number >= 0", "body.priority"),
    ("priority-string", "PUT", "/API/v1/queues/{q}/messages/{r}/priority", {"priority": "2"},
     "expected integer", "body.priority"),
    ("priority-unknown-property", "PUT", "/API/v1/queues/{q}/messages/{r}/priority",
     {"priority": 2, "group": "h"}, "unexpected property", "body.group"),
    # generate ids
    ("ids-missing-number", "POST", "/API/v1/ids", {},
     "expected required property number to be present", "body"),
    ("ids-number-0", "POST", "/API/v1/ids", {"number": 0}, "expected number >= 1", "body.number"),
    ("ids-number-1001", "POST", "/API/v1/ids", {"number": 1001}, "expected number <= 1000",
     "body.number"),
    ("ids-number-string", "POST", "/API/v1/ids", {"number": "3"}, "expected integer",
     "body.number"),
    ("ids-unknown-property", "POST", "/API/v1/ids", {"number": 3, "node": 1},
     "unexpected property", "body.node"),
]


@pytest.mark.parametrize("case,method,path,body,message,location", SCHEMA_CASES,
                         ids=[c[0] for c in SCHEMA_CASES])
def test_schema_validation_422(http: Http, victim: Victim, case: str, method: str, path: str,
                               body: Any, message: str, location: str) -> None:
    body = fill_body(victim, body)
    raw = json.dumps(body).encode()
    resp = rejected(http, victim, method, path, raw=raw,
                    headers={"Content-Type": "application/json"})
    out = invalid(resp, message, location)
    assert "value" in out["errors"][0]


def test_schema_validation_reports_every_problem(http: Http, victim: Victim) -> None:
    resp = rejected(http, victim, "POST", "/API/v1/queues/{q}/messages",
                    body={"priority": -5, "group": 1, "extra": True})
    out = problem(resp, 422, "validation failed")
    assert sorted((e["message"], e["location"]) for e in out["errors"]) == sorted([
        ("expected required property content to be present", "body"),
        ("expected number >= 0", "body.priority"), ("expected string", "body.group"),
        ("unexpected property", "body.extra")])


def test_property_names_are_case_insensitive(http: Http) -> None:
    name = unique("case")
    create(http, name, "fair")
    out = ok(http.post(f"/API/v1/queues/{name}/messages",
                       {"Priority": 4, "CONTENT": "c", "Group": "g"}))
    assert (out["priority"], out["content"], out["group"]) == (4, "c", "g")
    ok(http.put(f"/API/v1/queues/{name}/messages/{out['id']}/priority", {"PRIORITY": 8}))
    assert get_message(http, name, out["id"])["priority"] == 8
    assert dequeue(http, name)["id"] == out["id"]
    resp = ok(http.post(f"/API/v1/queues/{name}/messages/{out['id']}/nack",
                        {"Priority": 9, "MetaData": {"x": "y"}}))
    assert resp["priority"] == 9 and resp["metadata"] == {"x": "y"}
    assert ok(http.post("/API/v1/ids", {"Number": 2}))["ids"]
    ok(http.put(f"/API/v1/queues/{name}", {"SETTINGS": {"Max_Unacked": 4}}))
    assert info(http, name)["settings"]["max_unacked"] == 4
    # $schema is accepted and ignored everywhere
    out = enqueue(http, name, 1, "s", **{"$schema": "http://127.0.0.1/schemas/Enqueue.json"})
    assert "$schema" not in get_message(http, name, out["id"]).get("metadata", {})


@pytest.mark.parametrize("raw_id", ["abc", "-1", "1.5", "0x10", "18446744073709551616", "%20"])
@pytest.mark.parametrize("method,path,body", [
    ("GET", "/API/v1/queues/{q}/messages/{id}", None),
    ("DELETE", "/API/v1/queues/{q}/messages/{id}", None),
    ("POST", "/API/v1/queues/{q}/messages/{id}/ack", None),
    ("POST", "/API/v1/queues/{q}/messages/{id}/nack", {"priority": 1}),
    ("POST", "/API/v1/queues/{q}/messages/{id}/touch", None),
    ("PUT", "/API/v1/queues/{q}/messages/{id}/priority", {"priority": 1}),
], ids=["get", "delete", "ack", "nack", "touch", "update-priority"])
def test_path_id_not_uint64_422(http: Http, victim: Victim, method: str, path: str,
                                body: Any, raw_id: str) -> None:
    path = path.replace("{id}", raw_id)
    value = " " if raw_id == "%20" else raw_id
    invalid(rejected(http, victim, method, path, body=body), "invalid integer", "path.id",
            value=value)


@pytest.mark.parametrize("raw", ["maybe", "yes", "on", "2", "tRUE", "FaLsE", "%20"])
def test_query_ack_invalid_422(http: Http, victim: Victim, raw: str) -> None:
    value = " " if raw == "%20" else raw
    invalid(rejected(http, victim, "GET", f"/API/v1/queues/{{q}}/messages?ack={raw}"),
            "invalid boolean", "query.ack", value=value)


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/API/v1/queues/{long}", None),
    ("PUT", "/API/v1/queues/{long}", {"settings": {}}),
    ("DELETE", "/API/v1/queues/{long}", None),
    ("POST", "/API/v1/queues/{long}/messages", {"priority": 1, "content": "x"}),
    ("GET", "/API/v1/queues/{long}/messages", None),
    ("GET", "/API/v1/queues/{long}/messages/1", None),
], ids=["info", "update", "delete", "enqueue", "dequeue", "get"])
def test_path_queue_name_too_long_422(http: Http, victim: Victim, method: str, path: str,
                                      body: Any) -> None:
    long = "q" * 1025
    invalid(rejected(http, victim, method, path.replace("{long}", long), body=body),
            "expected length <= 1024", "path.queue_name", value=long)


# -- text, names, groups and metadata held to doq_lib/rules.py before any proposal ---
SURROGATE = "\udfff"          # json.dumps writes it as the escape "\udfff": valid JSON syntax
NOT_TEXT = "expected valid Unicode text (found a lone surrogate)"
MSG = "/API/v1/queues/{q}/messages"
EDGE_CASES: list[tuple[str, str, str, Any, str, str]] = [
    ("content-surrogate", "POST", MSG, {"priority": 1, "content": "a" + SURROGATE}, NOT_TEXT,
     "body.content"),
    ("group-surrogate", "POST", MSG, {"priority": 1, "content": "x", "group": SURROGATE},
     NOT_TEXT, "body.group"),
    ("metadata-key-surrogate", "POST", MSG,
     {"priority": 1, "content": "x", "metadata": {SURROGATE: "v"}}, NOT_TEXT,
     f"body.metadata.{SURROGATE}"),
    ("metadata-value-surrogate", "POST", MSG,
     {"priority": 1, "content": "x", "metadata": {"k": SURROGATE}}, NOT_TEXT,
     "body.metadata.k"),
    ("batch-content-surrogate", "POST", MSG + "/batch",
     {"messages": [{"priority": 1, "content": "ok"}, {"priority": 1, "content": SURROGATE}]},
     NOT_TEXT, "body.messages[1].content"),
    ("create-name-surrogate", "POST", "/API/v1/queues", {"name": "q" + SURROGATE,
                                                         "type": "fair"},
     NOT_TEXT, "body.name"),
    ("group-dotdot", "POST", MSG, {"priority": 1, "content": "x", "group": ".."},
     "expected a group other than '.' and '..'", "body.group"),
    ("group-dot", "POST", MSG, {"priority": 1, "content": "x", "group": "."},
     "expected a group other than '.' and '..'", "body.group"),
    ("group-nul", "POST", MSG, {"priority": 1, "content": "x", "group": "a\x00b"},
     "expected a group without control characters", "body.group"),
    ("group-crlf", "POST", MSG, {"priority": 1, "content": "x", "group": "a\r\nb"},
     "expected a group without control characters", "body.group"),
    ("group-blank", "POST", MSG, {"priority": 1, "content": "x", "group": " \t "},
     "expected a group without control characters", "body.group"),
    ("group-spaces", "POST", MSG, {"priority": 1, "content": "x", "group": "   "},
     "expected a group that is not only spaces", "body.group"),
    ("group-too-long", "POST", MSG, {"priority": 1, "content": "x",
                                     "group": "g" * (rules.MAX_GROUP + 1)},
     f"expected length <= {rules.MAX_GROUP}", "body.group"),
    ("batch-group-dotdot", "POST", MSG + "/batch",
     {"messages": [{"priority": 1, "content": "ok"},
                   {"priority": 1, "content": "x", "group": ".."}]},
     "expected a group other than '.' and '..'", "body.messages[1].group"),
    ("metadata-too-many", "POST", MSG,
     {"priority": 1, "content": "x",
      "metadata": {f"k{i}": "v" for i in range(rules.MAX_METADATA + 1)}},
     f"expected at most {rules.MAX_METADATA} properties", "body.metadata"),
    ("metadata-empty-key", "POST", MSG, {"priority": 1, "content": "x", "metadata": {"": "v"}},
     "expected length >= 1", "body.metadata."),
    ("metadata-key-control", "POST", MSG,
     {"priority": 1, "content": "x", "metadata": {"a\nb": "v"}},
     "expected a key without control characters", "body.metadata.a\nb"),
    ("metadata-key-dots", "POST", MSG, {"priority": 1, "content": "x", "metadata": {"..": "v"}},
     "expected a key other than '.' and '..'", "body.metadata..."),
    ("metadata-key-too-long", "POST", MSG,
     {"priority": 1, "content": "x", "metadata": {"k" * (rules.MAX_METADATA_KEY + 1): "v"}},
     f"expected length <= {rules.MAX_METADATA_KEY}",
     "body.metadata." + "k" * (rules.MAX_METADATA_KEY + 1)),
    ("metadata-value-too-long", "POST", MSG,
     {"priority": 1, "content": "x", "metadata": {"k": "v" * (rules.MAX_METADATA_VALUE + 1)}},
     f"expected length <= {rules.MAX_METADATA_VALUE}", "body.metadata.k"),
    ("nack-metadata-key", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": 1, "metadata": {"": "v"}}, "expected length >= 1", "body.metadata."),
    ("nack-batch-metadata-count", "POST", "/API/v1/queues/{q}/messages/nack",
     {"ids": ["{u}"], "metadata": {f"k{i}": "v" for i in range(rules.MAX_METADATA + 1)}},
     f"expected at most {rules.MAX_METADATA} properties", "body.metadata"),
]


@pytest.mark.parametrize("case,method,path,body,message,location", EDGE_CASES,
                         ids=[c[0] for c in EDGE_CASES])
def test_text_names_groups_and_metadata_are_checked_at_the_edge(
        http: Http, victim: Victim, case: str, method: str, path: str, body: Any,
        message: str, location: str) -> None:
    body = fill_body(victim, body)
    if "ids" in body:
        body["ids"] = [victim.fill(i) for i in body["ids"]]
    resp = rejected(http, victim, method, path, raw=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"})
    invalid(resp, message, location)


@pytest.mark.parametrize(("name", "message"), [
    (".", "expected a name other than '.' and '..'"),
    ("..", "expected a name other than '.' and '..'"),
    ("   ", "expected a name that is not only spaces"),
    ("a\x00b", "expected a name without control characters"),
    ("a\r\nb", "expected a name without control characters"),
    ("c1\x9b", "expected a name without control characters"),
], ids=["dot", "dotdot", "blank", "nul", "crlf", "c1-control"])
def test_create_queue_refuses_names_that_are_wrong_for_a_queue(
        http: Http, victim: Victim, name: str, message: str) -> None:
    resp = rejected(http, victim, "POST", "/API/v1/queues", body={"name": name, "type": "fair"})
    invalid(resp, message, "body.name", value=name)
    assert name not in {q["name"] for q in ok(http.get("/API/v1/queues"))["queues"]}


@pytest.mark.parametrize("segment", ["%ED%BF%BF", "{q}%ED%A0%80", "{q}%E9"],
                         ids=["low-surrogate", "high-surrogate", "latin-1"])
def test_a_path_that_is_not_utf8_is_refused(http: Http, victim: Victim, segment: str) -> None:
    """Percent-escapes that do not encode UTF-8: Bottle would drop the bytes and route the
    request to another queue (the victim, here); the server refuses it instead."""
    resp = rejected(http, victim, "POST", "/API/v1/queues/" + segment + "/messages",
                    body={"priority": 1, "content": "x"})
    out = problem(resp, 400, "malformed request")
    assert out["errors"] == [{"message": "the request path is not valid UTF-8 "
                                         "(percent-escapes must encode UTF-8 text)"}]


def test_names_groups_and_metadata_at_the_limits_are_stored(http: Http) -> None:
    name = unique("edge") + " é ü"
    create(http, name, "fair")
    quoted = urllib.parse.quote(name, safe="")
    metadata = {f"k{i:02}": "v" for i in range(rules.MAX_METADATA - 1)}
    metadata["k" * rules.MAX_METADATA_KEY] = "v" * rules.MAX_METADATA_VALUE
    group = "g" * (rules.MAX_GROUP - 4) + ".a.b"
    out = ok(http.post(f"/API/v1/queues/{quoted}/messages",
                       {"priority": 1, "content": "ü\x00\n", "group": group,
                        "metadata": metadata}))
    got = get_message(http, quoted, out["id"])
    assert (got["group"], got["metadata"], got["content"]) == (group, metadata, "ü\x00\n")
