"""Queue routes, one at a time: create, list, info, update, delete (SPEC §3.2; §12.2
handler tests)."""
from __future__ import annotations

import urllib.parse
import uuid
from typing import Any

import pytest

from tests.harness import Http
from tests.http.shapes import (
    INFO_KEYS,
    assert_empty,
    assert_no_queue,
    business,
    counts,
    create,
    dequeue,
    enqueue,
    get_message,
    info,
    invalid,
    ok,
    problem,
    snapshot,
    unique,
)


# == success shapes, one route at a time (SPEC §3.2, §3.3; §12.2 handler tests) =================
def test_create_queue_echoes_request_settings(http: Http) -> None:
    fair, delayed, weighted, bare = (unique(p) for p in ("fair", "delayed", "weighted", "bare"))
    out = ok(http.post("/API/v1/queues", {"name": fair, "type": "fair", "settings": {
        "strategy": "round_robin", "max_unacked": 3, "ack_timeout": 60}}))
    assert out == {"status": "CREATED", "name": fair, "type": "fair",
                   "settings": {"strategy": "ROUND_ROBIN", "max_unacked": 3, "ack_timeout": 60}}
    out = ok(http.post("/API/v1/queues", {"name": delayed, "type": "delayed",
                                          "settings": {"max_unacked": 0}}))
    assert out == {"status": "CREATED", "name": delayed, "type": "delayed", "settings": {}}
    out = ok(http.post("/API/v1/queues", {"name": weighted, "type": "fair",
                                          "settings": {"strategy": "weighted"}}))
    assert out["settings"] == {"strategy": "WEIGHTED"}
    # D3: settings may be omitted; D1: a fair queue without a strategy is round robin
    out = ok(http.post("/API/v1/queues", {"name": bare, "type": "fair"}))
    assert out == {"status": "CREATED", "name": bare, "type": "fair", "settings": {}}
    assert info(http, bare)["settings"] == {"strategy": "ROUND_ROBIN", "ack_timeout": 1800}
    assert info(http, weighted)["settings"] == {"strategy": "WEIGHTED", "ack_timeout": 1800}


def test_create_queue_property_names_case_insensitive_and_schema_ignored(http: Http) -> None:
    name = unique("casing")
    out = ok(http.post("/API/v1/queues", {"$schema": "http://127.0.0.1/schemas/X.json",
                                          "NAME": name, "Type": "fair",
                                          "Settings": {"Max_Unacked": 2, "STRATEGY": "weighted"}}))
    assert out == {"status": "CREATED", "name": name, "type": "fair",
                   "settings": {"strategy": "WEIGHTED", "max_unacked": 2}}
    assert info(http, name)["settings"] == {"strategy": "WEIGHTED", "max_unacked": 2,
                                            "ack_timeout": 1800}


def test_create_duplicate_keeps_existing_queue(http: Http) -> None:
    name = unique("dup")
    create(http, name, "fair", {"strategy": "weighted", "max_unacked": 4, "ack_timeout": 120})
    mid = enqueue(http, name, group="g")["id"]
    before = snapshot(http, name, [mid])
    out = ok(http.post("/API/v1/queues", {"name": name, "type": "delayed",
                                          "settings": {"ack_timeout": 600}}))
    # the original's 200 CREATED, with the stored definition and a flag a client can test
    assert out == {"status": "CREATED", "name": name, "existed": True, "type": "fair",
                   "settings": {"strategy": "WEIGHTED", "max_unacked": 4, "ack_timeout": 120}}
    assert snapshot(http, name, [mid]) == before
    # validation of the settings combination is skipped for an existing name, too
    ok(http.post("/API/v1/queues", {"name": name, "type": "delayed",
                                    "settings": {"strategy": "round_robin", "max_unacked": 1}}))
    assert snapshot(http, name, [mid]) == before
    assert before["type"] == "fair" and before["settings"] == {
        "strategy": "WEIGHTED", "max_unacked": 4, "ack_timeout": 120}


def test_create_queue_unicode_and_escaped_names(http: Http) -> None:
    for name in (unique("ünï"), unique("with space"), unique("a:b?c#d")):
        create(http, name, "delayed")
        escaped = urllib.parse.quote(name, safe="")
        assert info(http, escaped)["name"] == name
        mid = enqueue(http, escaped)["id"]
        assert get_message(http, escaped, mid)["id"] == mid
        assert ok(http.delete(f"/API/v1/queues/{escaped}")) == {"status": "DELETED"}


def test_create_queue_name_limits(http: Http) -> None:
    longest = "n" * 1000 + uuid.uuid4().hex[:24]
    assert len(longest) == 1024
    create(http, longest, "fair")
    assert info(http, longest)["name"] == longest
    too_long = longest + "x"
    invalid(http.post("/API/v1/queues", {"name": too_long, "type": "fair"}),
            "expected length <= 1024", "body.name", value=too_long)
    for bad in ("", "a/b", "/"):
        out = problem(http.post("/API/v1/queues", {"name": bad, "type": "fair"}), 422,
                      "validation failed")
        assert [(e["location"], e["value"]) for e in out["errors"]] == [("body.name", bad)]
    assert not any(q["name"] in ("", "a/b", too_long)
                   for q in ok(http.get("/API/v1/queues"))["queues"])


@pytest.mark.parametrize("qtype,settings,reason", [
    ("delayed", {"strategy": "round_robin"}, "invalid strategy"),
    ("delayed", {"strategy": "weighted"}, "invalid strategy"),
    ("delayed", {"max_unacked": 3}, "invalid max unacked"),
], ids=["delayed+round_robin", "delayed+weighted", "delayed+max_unacked"])
def test_create_invalid_combination_409(http: Http, qtype: str, settings: dict[str, Any],
                                        reason: str) -> None:
    name = unique("combo")
    business(http.post("/API/v1/queues", {"name": name, "type": qtype, "settings": settings}),
             409, "Failed to enqueue a message", f"Failed to create a queue: {name}: {reason}")
    assert_no_queue(http, name)


def test_list_queues_sorted_by_name(http: Http) -> None:
    tag = uuid.uuid4().hex[:8]
    names = [f"list-{tag}-{suffix}" for suffix in ("m", "a", "z", "b")]
    for name in names:
        create(http, name, "fair" if name.endswith(("a", "z")) else "delayed")
    enqueue(http, names[1], group="g")
    queues = ok(http.get("/API/v1/queues"))["queues"]
    listed = [q["name"] for q in queues]
    assert listed == sorted(listed)
    ours = [q for q in queues if q["name"].startswith(f"list-{tag}-")]
    assert [q["name"] for q in ours] == sorted(names)
    for q in ours:
        assert set(q) == INFO_KEYS
    by_name = {q["name"]: q for q in ours}
    assert by_name[names[1]]["ready"] == 1 and by_name[names[1]]["total"] == 1
    assert by_name[names[0]]["settings"]["strategy"] == "STRATEGY_UNSPECIFIED"


def test_queue_info_shape(http: Http) -> None:
    delayed, fair = unique("info-d"), unique("info-f")
    create(http, delayed, "delayed")
    create(http, fair, "fair", {"max_unacked": 2, "ack_timeout": 300})
    out = info(http, delayed)
    assert out == {"name": delayed, "type": "delayed",
                   "settings": {"strategy": "STRATEGY_UNSPECIFIED", "ack_timeout": 1800},
                   "enqueue_rps": 0.0, "dequeue_rps": 0.0, "ack_rps": 0.0, "nack_rps": 0.0,
                   "ready": 0, "unacked": 0, "total": 0}
    assert all(isinstance(out[k], float) for k in ("enqueue_rps", "dequeue_rps", "ack_rps",
                                                     "nack_rps"))
    assert info(http, fair)["settings"] == {"strategy": "ROUND_ROBIN", "max_unacked": 2,
                                            "ack_timeout": 300}
    for _ in range(3):
        enqueue(http, fair, group="g")
    dequeue(http, fair)
    assert counts(http, fair) == (2, 1, 3)


def test_update_queue(http: Http) -> None:
    name = unique("upd")
    create(http, name, "fair", {"strategy": "weighted", "max_unacked": 1})
    out = ok(http.put(f"/API/v1/queues/{name}", {"settings": {
        "strategy": "weighted", "max_unacked": 5, "ack_timeout": 90}}))
    assert out == {"status": "UPDATED", "name": name,
                   "settings": {"strategy": "WEIGHTED", "max_unacked": 5, "ack_timeout": 90}}
    assert info(http, name)["settings"] == {"strategy": "WEIGHTED", "max_unacked": 5,
                                            "ack_timeout": 90}
    # an omitted strategy keeps the current one; ack_timeout omitted -> the default again
    out = ok(http.put(f"/API/v1/queues/{name}", {"settings": {"max_unacked": 0}}))
    assert out == {"status": "UPDATED", "name": name, "settings": {}}
    assert info(http, name)["settings"] == {"strategy": "WEIGHTED", "ack_timeout": 1800}


def test_update_delayed_queue_ignores_max_unacked(http: Http) -> None:
    name = unique("upd-d")
    create(http, name, "delayed")
    out = ok(http.put(f"/API/v1/queues/{name}", {"settings": {"ack_timeout": 61,
                                                               "max_unacked": 7}}))
    assert out["settings"] == {"ack_timeout": 61, "max_unacked": 7}
    assert info(http, name)["settings"] == {"strategy": "STRATEGY_UNSPECIFIED",
                                            "ack_timeout": 61}


def test_update_queue_strategy_change_409_changes_nothing(http: Http) -> None:
    name = unique("upd-conflict")
    create(http, name, "fair", {"max_unacked": 3, "ack_timeout": 100})
    mid = enqueue(http, name, group="g")["id"]
    before = snapshot(http, name, [mid])
    for strategy in ("weighted",):
        business(http.put(f"/API/v1/queues/{name}", {"settings": {
            "strategy": strategy, "max_unacked": 9, "ack_timeout": 200}}),
            409, "Failed to update a queue",
            f"Failed to update a queue: {name}: invalid queue settings")
    assert snapshot(http, name, [mid]) == before


def test_delete_queue(http: Http) -> None:
    name = unique("del")
    create(http, name, "fair", {"strategy": "weighted"})
    enqueue(http, name, group="a")
    unacked = dequeue(http, name)["id"]
    ready = enqueue(http, name, group="b")["id"]
    assert ok(http.delete(f"/API/v1/queues/{name}")) == {"status": "DELETED"}
    assert_no_queue(http, name)
    assert name not in [q["name"] for q in ok(http.get("/API/v1/queues"))["queues"]]
    business(http.post(f"/API/v1/queues/{name}/messages/{unacked}/ack"), 400,
             "Failed to ack a message from a queue", f"Failed to get a queue: {name}")
    business(http.delete(f"/API/v1/queues/{name}"), 400,
             "Failed to dequeue a message from a queue", f"Failed to delete a queue: {name}")
    # a re-created queue starts empty, with its new definition
    create(http, name, "delayed")
    assert info(http, name)["type"] == "delayed"
    assert counts(http, name) == (0, 0, 0)
    business(http.get(f"/API/v1/queues/{name}/messages/{ready}"), 400,
             "Failed to get a message from a queue",
             f"Failed to get a message from a queue: {name}")
    assert_empty(http, name)
