"""The REST API end to end against a real node process (SPEC §3, §5, §12.1, §12.2 HTTP tests).

One single-node cluster serves the whole module (a second one, with a 2 s default ack timeout,
serves the redelivery test). Every test uses its own queue names, so tests are independent of
each other except the §12.1 pair ``test_regular_queue`` -> ``test_delayed_queue``, which share a
queue exactly as the reference suite does.

Validation rows (§3.1) and business errors (§3.3/§3.4) are table-driven; after every rejected
request the target queue is compared with a snapshot taken before it (counts, settings and every
known message as returned by GET by id): bad input changes nothing.
"""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from http.client import HTTPConnection
from typing import Any, Iterator

import pytest

from tests.harness import Cluster, Http, NodeProc, Response, free_ports, wait_until

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


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    cluster = Cluster(str(tmp_path_factory.mktemp("http-node")), size=1).start()
    try:
        yield cluster.nodes[0]
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def http(node: NodeProc) -> Iterator[Http]:
    client = node.http()
    yield client
    client.close()


@pytest.fixture(scope="module")
def aux_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """A second node: 2 s default ack timeout, and the state machine's fault injection on."""
    cluster = Cluster(str(tmp_path_factory.mktemp("http-aux")), size=1,
                      flags={"queue.default_acknowledgement_timeout": "2"},
                      env={"DOQ_FAULT_INJECTION": "1"}).start()
    try:
        yield cluster.nodes[0]
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def leaderless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """A node of a three-member cluster whose two peers never answer: it never has a leader.

    The peers' ports stay bound (not listening) by this fixture, so connections to them are
    refused and no other process can take them meanwhile.
    """
    http_port, raft_port = free_ports(2)
    holders = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        holders.append(sock)
    peers = [f"127.0.0.1:{raft_port}"] + [f"127.0.0.1:{s.getsockname()[1]}" for s in holders]
    node = NodeProc("lonely", http_port, raft_port, str(tmp_path_factory.mktemp("lonely")),
                    peers)
    node.start()
    try:
        wait_until(lambda: answers(node, "/livez"), timeout=30, describe=node.tail)
        yield node
    finally:
        node.stop()
        for sock in holders:
            sock.close()


def answers(node: NodeProc, path: str) -> bool:
    client = Http(node.http_port, timeout=2)
    try:
        return client.get(path).status == 200
    finally:
        client.close()


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


# == SPEC §12.1: the reference's end-to-end suite ================================================
PEOPLE = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov",
          "Donald Knuth", "Frances Allen", "Ken Thompson"]
E2E = {key: unique(key) for key in ("fair-transcode", "registration", "registration-manual-ack",
                                    "registration-manual-nack", "login")}


def e2e_messages(priorities: list[int], groups: list[str]) -> list[dict[str, Any]]:
    return [{"content": json.dumps({"id": i + 1, "name": PEOPLE[i]}), "priority": p, "group": g,
             "metadata": {"index": str(i)}}
            for i, (p, g) in enumerate(zip(priorities, groups))]


GROUPS_8 = ["customer-1"] * 4 + ["customer-2"] * 2 + ["customer-3", "customer-4"]


@pytest.fixture(scope="module")
def e2e_queues(http: Http) -> Iterator[dict[str, str]]:
    types = {"fair-transcode": "fair"}
    for key, name in E2E.items():
        qtype = types.get(key, "delayed")
        out = ok(http.post("/API/v1/queues", {"type": qtype, "name": name, "settings": {}}))
        assert (out["status"], out["type"], out["name"]) == ("CREATED", qtype, name)
    yield E2E
    for name in E2E.values():
        assert ok(http.delete(f"/API/v1/queues/{name}")) == {"status": "DELETED"}


def enqueue_all(http: Http, queue: str, messages: list[dict[str, Any]]) -> list[str]:
    ids = []
    for message in messages:
        out = enqueue(http, queue, **message)
        assert out["priority"] == message["priority"] and out["content"] == message["content"]
        assert out["metadata"] == message["metadata"]
        ids.append(out["id"])
    return ids


def drain_in_order(http: Http, queue: str, messages: list[dict[str, Any]],
                   order: list[int]) -> None:
    for index in order:
        out = dequeue(http, queue, ack=True)
        expected = messages[index]
        assert (out["content"], out["priority"]) == (expected["content"], expected["priority"])
        assert out["metadata"] == expected["metadata"]


def test_fair_priority_queue(http: Http, e2e_queues: dict[str, str]) -> None:
    queue = e2e_queues["fair-transcode"]
    messages = e2e_messages([10] * 8, GROUPS_8)
    ids = enqueue_all(http, queue, messages)
    for mid, message in zip(ids, messages):
        got = get_message(http, queue, mid)
        assert got == {"status": "GOT", "id": mid, **message}
    drain_in_order(http, queue, messages, [0, 4, 6, 7, 1, 5, 2, 3])


def test_regular_queue(http: Http, e2e_queues: dict[str, str]) -> None:
    messages = e2e_messages([10] * 8, GROUPS_8)
    enqueue_all(http, e2e_queues["registration"], messages)
    drain_in_order(http, e2e_queues["registration"], messages, list(range(8)))


def test_priority_queue(http: Http, e2e_queues: dict[str, str]) -> None:
    messages = e2e_messages([123, 523, 35, 7863, 12, 4, 1, 4555], GROUPS_8)
    enqueue_all(http, e2e_queues["login"], messages)
    drain_in_order(http, e2e_queues["login"], messages, [6, 5, 4, 2, 0, 1, 7, 3])


def test_delayed_queue(http: Http, e2e_queues: dict[str, str]) -> None:
    """SPEC §5.2 worked example, on the queue ``test_regular_queue`` drained, in real time."""
    queue = e2e_queues["registration"]
    # start early in a second, so "not due yet" is checked well before the next second begins
    wait_until(lambda: time.time() % 1 < 0.5, timeout=2, interval=0.02)
    now = int(time.time())
    a, b, c = e2e_messages([now + 2, now + 1, 10], ["customer-1"] * 3)
    enqueue_all(http, queue, [a, b, c])

    def next_due() -> dict[str, Any] | None:
        resp = http.get(f"/API/v1/queues/{queue}/messages?ack=true")
        return resp.json() if resp.status == 200 else None

    assert dequeue(http, queue, ack=True)["content"] == c["content"]
    assert_empty(http, queue, ack=True)
    got_b = wait_until(next_due, timeout=4, interval=0.05)
    assert time.time() >= now + 1, "a message was delivered before its timestamp"
    assert got_b["content"] == b["content"] and got_b["priority"] == now + 1
    assert_empty(http, queue, ack=True)
    got_a = wait_until(next_due, timeout=4, interval=0.05)
    assert time.time() >= now + 2, "a message was delivered before its timestamp"
    assert got_a["content"] == a["content"] and got_a["priority"] == now + 2
    assert_empty(http, queue, ack=True)


def test_message_ack(http: Http, e2e_queues: dict[str, str]) -> None:
    queue = e2e_queues["registration-manual-ack"]
    messages = e2e_messages([10] * 8, GROUPS_8)
    enqueue_all(http, queue, messages)
    for message in messages:
        out = dequeue(http, queue, ack=False)
        assert out["content"] == message["content"]
        assert ok(http.post(f"/API/v1/queues/{queue}/messages/{out['id']}/ack")) == {
            "status": "ACKNOWLEDGED", "id": out["id"]}
    for _ in range(8):
        resp = http.get(f"/API/v1/queues/{queue}/messages?ack=false")
        assert resp.status == 400
        assert resp.json()["errors"] == [{"message": f"Queue is empty: {queue}"}]


def test_message_nack(http: Http, e2e_queues: dict[str, str]) -> None:
    queue = e2e_queues["registration-manual-nack"]
    messages = e2e_messages([10] * 3, ["customer-1"] * 3)
    enqueue_all(http, queue, messages)
    delivered = [dequeue(http, queue, ack=False) for _ in messages]
    for out in delivered:
        resp = http.post(f"/API/v1/queues/{queue}/messages/{out['id']}/nack",
                         {"priority": 10, "metadata": {"retry": "1"}})
        assert ok(resp)["status"] == "UNACKNOWLEDGED"
    for original in delivered:
        again = dequeue(http, queue, ack=True)
        assert (again["id"], again["content"]) == (original["id"], original["content"])
        assert again["metadata"] == {"retry": "1"}
    assert_empty(http, queue)


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
    assert out == {"status": "CREATED", "name": name, "type": "delayed",
                   "settings": {"ack_timeout": 600}}
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


def test_enqueue_shapes_and_ids(http: Http) -> None:
    name = unique("enq")
    create(http, name, "fair")
    generated = enqueue(http, name, 5, "hello")
    assert generated == {"status": "ENQUEUED", "id": generated["id"], "priority": 5,
                         "content": "hello"}
    assert set(generated) <= MESSAGE_KEYS
    # enqueue without group stores "default" (SPEC §12.2 TestNew); "" is the same
    assert get_message(http, name, generated["id"])["group"] == "default"
    blank = enqueue(http, name, 5, "", group="", metadata={}, id="")
    assert "group" not in blank and "metadata" not in blank and blank["content"] == ""
    zero = enqueue(http, name, 5, "z", id="0")
    assert zero["id"] != "0"
    ids = [int(m["id"]) for m in (generated, blank, zero)]
    assert ids == sorted(set(ids))
    client = enqueue(http, name, 7, "c", id="1", group="g", metadata={"k": "v"})
    assert client == {"status": "ENQUEUED", "id": "1", "group": "g", "priority": 7,
                      "content": "c", "metadata": {"k": "v"}}
    largest = enqueue(http, name, 7, "big", id=str(INT64_MAX))
    assert largest["id"] == str(INT64_MAX)
    assert get_message(http, name, str(INT64_MAX))["content"] == "big"
    assert counts(http, name) == (5, 0, 5)


def test_enqueue_delayed_queue_echoes_group_but_stores_default(http: Http) -> None:
    name = unique("enq-d")
    create(http, name, "delayed")
    out = enqueue(http, name, 1, "c", group="customer-1")
    assert out["group"] == "customer-1"
    assert get_message(http, name, out["id"])["group"] == "default"
    assert dequeue(http, name, ack=True)["group"] == "default"


def test_dequeue_default_is_ack_false(http: Http) -> None:
    name = unique("deq")
    create(http, name, "fair")
    sent = enqueue(http, name, 3, "body", group="g", metadata={"a": "b"})
    out = ok(http.get(f"/API/v1/queues/{name}/messages"))
    assert out == {"status": "DEQUEUED", "id": sent["id"], "group": "g", "priority": 3,
                   "content": "body", "metadata": {"a": "b"}}
    assert counts(http, name) == (0, 1, 1)
    assert get_message(http, name, sent["id"])["content"] == "body"   # still stored
    assert_empty(http, name)
    business(http.get(f"/API/v1/queues/{name}/messages?ack="), 400,
             "Failed to dequeue a message from a queue", f"Queue is empty: {name}")


@pytest.mark.parametrize("spelling", TRUE_SPELLINGS + FALSE_SPELLINGS)
def test_dequeue_accepted_ack_spellings(http: Http, spelling: str) -> None:
    name = unique("spell")
    create(http, name)
    mid = enqueue(http, name)["id"]
    out = ok(http.get(f"/API/v1/queues/{name}/messages?ack={spelling}"))
    assert out["id"] == mid
    if spelling in TRUE_SPELLINGS:
        assert counts(http, name) == (0, 0, 0)
    else:
        assert counts(http, name) == (0, 1, 1)


def test_get_by_id_ready_and_unacked(http: Http) -> None:
    name = unique("get")
    create(http, name, "fair")
    first = enqueue(http, name, 1, "one", group="g", metadata={"m": "1"})
    second = enqueue(http, name, 2, "two", group="h")
    dequeue(http, name)
    assert get_message(http, name, first["id"]) == {
        "status": "GOT", "id": first["id"], "group": "g", "priority": 1, "content": "one",
        "metadata": {"m": "1"}}
    assert get_message(http, name, second["id"]) == {
        "status": "GOT", "id": second["id"], "group": "h", "priority": 2, "content": "two"}
    # a not-yet-due delayed message is visible too
    delayed = unique("get-d")
    create(http, delayed)
    future = enqueue(http, delayed, int(time.time()) + 3600, "later")
    assert get_message(http, delayed, future["id"])["content"] == "later"


def test_delete_message_204(http: Http) -> None:
    name = unique("delmsg")
    create(http, name, "fair")
    unacked = enqueue(http, name, 1, group="g")["id"]
    ready = enqueue(http, name, 2, group="g")["id"]
    assert dequeue(http, name)["id"] == unacked
    for mid, after in ((ready, (0, 1, 1)), (unacked, (0, 0, 0))):
        resp = http.delete(f"/API/v1/queues/{name}/messages/{mid}")
        assert resp.status == 204 and resp.body == b""
        assert counts(http, name) == after
        business(http.get(f"/API/v1/queues/{name}/messages/{mid}"), 400,
                 "Failed to get a message from a queue",
                 f"Failed to get a message from a queue: {name}")
    business(http.post(f"/API/v1/queues/{name}/messages/{unacked}/ack"), 400,
             "Failed to ack a message from a queue", f"Message not found: {name}")
    assert_empty(http, name)


def test_ack(http: Http) -> None:
    name = unique("ack")
    create(http, name, "fair")
    mid = enqueue(http, name, group="g")["id"]
    dequeue(http, name)
    assert ok(http.post(f"/API/v1/queues/{name}/messages/{mid}/ack")) == {
        "status": "ACKNOWLEDGED", "id": mid}
    assert counts(http, name) == (0, 0, 0)
    # client id kept through dequeue/ack (TestNodeSingleNodeAck); a body is ignored
    enqueue(http, name, id="12312")
    assert dequeue(http, name)["id"] == "12312"
    assert ok(http.post(f"/API/v1/queues/{name}/messages/12312/ack",
                        raw=b"not json", headers={"Content-Type": "text/plain"})) == {
        "status": "ACKNOWLEDGED", "id": "12312"}
    business(http.post(f"/API/v1/queues/{name}/messages/12312/ack"), 400,
             "Failed to ack a message from a queue", f"Message not found: {name}")


def test_nack_priority_and_metadata(http: Http) -> None:
    name = unique("nack")
    create(http, name)
    mid = enqueue(http, name, 7, "c", metadata={"a": "1"})["id"]
    path = f"/API/v1/queues/{name}/messages/{mid}/nack"

    dequeue(http, name)
    assert ok(http.post(path, {"priority": 0})) == {
        "status": "UNACKNOWLEDGED", "id": mid, "priority": 7}          # 0 keeps the priority
    assert counts(http, name) == (1, 0, 1)
    got = get_message(http, name, mid)
    assert (got["priority"], got["metadata"]) == (7, {"a": "1"})       # metadata kept

    dequeue(http, name)
    assert ok(http.post(path, {"priority": 3, "metadata": {"b": "2"}})) == {
        "status": "UNACKNOWLEDGED", "id": mid, "priority": 3, "metadata": {"b": "2"}}
    got = get_message(http, name, mid)
    assert (got["priority"], got["metadata"]) == (3, {"b": "2"})       # replaced, not merged

    dequeue(http, name)
    ok(http.post(path, {"priority": 0, "metadata": None}))              # null: kept
    assert get_message(http, name, mid)["metadata"] == {"b": "2"}

    dequeue(http, name)
    out = ok(http.post(path, {"priority": 0, "metadata": {}}))          # {}: cleared
    assert out == {"status": "UNACKNOWLEDGED", "id": mid, "priority": 3}
    assert "metadata" not in get_message(http, name, mid)
    assert dequeue(http, name)["priority"] == 3


def test_nack_requeues_in_priority_order(http: Http) -> None:
    name = unique("nack-order")
    create(http, name)
    a = enqueue(http, name, 10, "a")["id"]
    b = enqueue(http, name, 20, "b")["id"]
    assert dequeue(http, name)["id"] == a
    ok(http.post(f"/API/v1/queues/{name}/messages/{a}/nack", {"priority": 30}))
    assert [dequeue(http, name, ack=True)["id"] for _ in range(2)] == [b, a]


def test_touch(http: Http) -> None:
    name = unique("touch")
    create(http, name, "fair")
    mid = enqueue(http, name, group="g")["id"]
    dequeue(http, name)
    assert ok(http.post(f"/API/v1/queues/{name}/messages/{mid}/touch", {"ignored": True})) == {
        "status": "TOUCHED", "id": mid}
    assert counts(http, name) == (0, 1, 1)
    assert ok(http.post(f"/API/v1/queues/{name}/messages/{mid}/ack"))["status"] == "ACKNOWLEDGED"
    business(http.post(f"/API/v1/queues/{name}/messages/{mid}/touch"), 400,
             "Failed to touch a message from a queue", f"Message not found: {name}")


def test_update_priority_ready_and_unacked(http: Http) -> None:
    name = unique("prio")
    create(http, name)
    a = enqueue(http, name, 10, "a")["id"]
    b = enqueue(http, name, 20, "b")["id"]
    c = enqueue(http, name, 30, "c", metadata={"keep": "me"})["id"]
    assert ok(http.put(f"/API/v1/queues/{name}/messages/{c}/priority", {"priority": 1})) == {
        "status": "UPDATED", "id": c, "priority": 1}
    assert get_message(http, name, c)["priority"] == 1
    assert dequeue(http, name)["id"] == c                       # repositioned immediately
    ok(http.put(f"/API/v1/queues/{name}/messages/{c}/priority", {"priority": 50}))
    got = get_message(http, name, c)
    assert (got["priority"], got["metadata"]) == (50, {"keep": "me"})
    assert counts(http, name) == (2, 1, 3)                     # still unacked
    assert ok(http.post(f"/API/v1/queues/{name}/messages/{c}/nack", {"priority": 0}))[
        "priority"] == 50
    assert [dequeue(http, name, ack=True)["id"] for _ in range(3)] == [a, b, c]


def test_update_priority_fair_queue_moves_behind_group_peers(http: Http) -> None:
    name = unique("prio-f")
    create(http, name, "fair")
    m1 = enqueue(http, name, 1, group="c1")["id"]
    m4 = enqueue(http, name, 4, group="c1")["id"]
    m5 = enqueue(http, name, 5, group="c2")["id"]
    ok(http.put(f"/API/v1/queues/{name}/messages/{m1}/priority", {"priority": 20}))
    assert [dequeue(http, name, ack=True)["id"] for _ in range(3)] == [m4, m5, m1]


def test_duplicate_client_id_creates_no_second_copy(http: Http) -> None:
    name = unique("dupid")
    create(http, name)
    enqueue(http, name, 50, "old", id="777")
    other = enqueue(http, name, 20, "other")["id"]
    out = enqueue(http, name, 10, "new", id="777", metadata={"v": "2"})
    assert out["id"] == "777"
    assert counts(http, name) == (2, 0, 2)
    got = get_message(http, name, "777")
    assert (got["priority"], got["content"], got["metadata"]) == (10, "new", {"v": "2"})
    assert dequeue(http, name)["id"] == "777"              # repositioned by its new priority
    enqueue(http, name, 1, "again", id="777")              # while unacked: stays unacked
    assert counts(http, name) == (1, 1, 2)
    assert dequeue(http, name, ack=True)["id"] == other
    assert_empty(http, name)
    assert ok(http.post(f"/API/v1/queues/{name}/messages/777/ack"))["status"] == "ACKNOWLEDGED"
    assert counts(http, name) == (0, 0, 0)


def test_duplicate_client_id_moves_to_its_new_group(http: Http) -> None:
    name = unique("dupid-f")
    create(http, name, "fair")
    enqueue(http, name, 1, "a1", group="a")
    enqueue(http, name, 5, "moved", id="5", group="a")
    enqueue(http, name, 1, "b1", group="b")
    enqueue(http, name, 9, "moved again", id="5", group="c")
    assert get_message(http, name, "5")["group"] == "c"
    assert counts(http, name) == (3, 0, 3)
    got = [dequeue(http, name, ack=True) for _ in range(3)]
    assert [(m["group"], m["content"]) for m in got] == [
        ("a", "a1"), ("b", "b1"), ("c", "moved again")]
    assert_empty(http, name)


def test_update_priority_to_a_future_timestamp_hides_a_delayed_message(http: Http) -> None:
    name = unique("prio-future")
    create(http, name)
    mid = enqueue(http, name, 1)["id"]
    ok(http.put(f"/API/v1/queues/{name}/messages/{mid}/priority",
                {"priority": int(time.time()) + 3600}))
    assert_empty(http, name)
    assert counts(http, name) == (1, 0, 1)              # hidden, but counted as ready
    ok(http.put(f"/API/v1/queues/{name}/messages/{mid}/priority", {"priority": 2}))
    assert dequeue(http, name, ack=True)["id"] == mid


def test_max_unacked_blocks_a_fair_group_until_ack(http: Http) -> None:
    name = unique("maxun")
    create(http, name, "fair", {"max_unacked": 2})
    g1 = [enqueue(http, name, 10, f"g1-{i}", group="g1")["id"] for i in range(3)]
    g2 = enqueue(http, name, 10, "g2", group="g2")["id"]
    assert [dequeue(http, name)["id"] for _ in range(3)] == [g1[0], g2, g1[1]]
    assert_empty(http, name)                              # g1 at its limit, g2 drained
    assert counts(http, name) == (1, 3, 4)                # the blocked message counts as ready
    ok(http.post(f"/API/v1/queues/{name}/messages/{g2}/ack"))
    assert_empty(http, name)                              # freeing g2's slot does not help g1
    ok(http.post(f"/API/v1/queues/{name}/messages/{g1[0]}/ack"))
    assert dequeue(http, name)["id"] == g1[2]
    # raising the limit takes effect immediately
    enqueue(http, name, 10, "g1-3", group="g1")
    assert_empty(http, name)
    ok(http.put(f"/API/v1/queues/{name}", {"settings": {"max_unacked": 3}}))
    assert dequeue(http, name)["content"] == "g1-3"


def test_nack_and_delete_free_the_group_slot(http: Http) -> None:
    name = unique("slot")
    create(http, name, "fair", {"max_unacked": 1})
    m1 = enqueue(http, name, 1, group="g")["id"]
    m2 = enqueue(http, name, 2, group="g")["id"]
    assert dequeue(http, name)["id"] == m1
    assert_empty(http, name)
    ok(http.post(f"/API/v1/queues/{name}/messages/{m1}/nack", {"priority": 0}))
    assert dequeue(http, name)["id"] == m1
    assert_empty(http, name)
    assert http.delete(f"/API/v1/queues/{name}/messages/{m1}").status == 204
    assert dequeue(http, name)["id"] == m2
    assert counts(http, name) == (0, 1, 1)


def test_hierarchical_round_robin(http: Http) -> None:
    """SPEC §5.3 hierarchical example (Go TestFairRoundRobinQueueWithSubgroups), over HTTP."""
    name = unique("tree")
    create(http, name, "fair")
    groups = {1: "customer-1.project-1.user-1", 2: "customer-1.project-1.user-1",
              3: "customer-1.project-1.user-2", 4: "customer-1.project-2.user-1",
              5: "customer-1.project-2.user-1", 6: "customer-1.project-2.user-2",
              7: "customer-1.project-3.user-1", 8: "customer-1.project-3.user-2",
              9: "customer-2", 10: "customer-3.project-1", 11: "customer-3.project-1",
              12: "customer-3.project-2", 13: "customer-4.project-1.user-1",
              14: "customer-4.project-1.user-2", 15: "customer-4.project-2.user-2"}
    for mid, group in groups.items():
        enqueue(http, name, 10, f"m{mid}", id=str(mid), group=group)
    order = [int(dequeue(http, name, ack=True)["id"]) for _ in groups]
    assert order == [1, 9, 10, 13, 4, 12, 15, 7, 11, 14, 3, 6, 8, 2, 5]


def test_weighted_queue_delivers_everything(http: Http) -> None:
    name = unique("weighted")
    create(http, name, "fair", {"strategy": "weighted"})
    sent = {enqueue(http, name, i % 4, f"m{i}", group=f"g{i % 3}")["id"] for i in range(19)}
    got = [dequeue(http, name, ack=True)["id"] for _ in range(19)]
    assert set(got) == sent and len(got) == 19
    assert_empty(http, name, ack=True)


def test_weighted_queue_respects_max_unacked(http: Http) -> None:
    name = unique("weighted-max")
    create(http, name, "fair", {"strategy": "weighted", "max_unacked": 8})
    sizes = {"a": 10, "b": 8, "c": 3, "d": 1}
    for group, size in sizes.items():
        for i in range(size):
            enqueue(http, name, i, f"{group}{i}", group=group)
    delivered: dict[str, list[int]] = {g: [] for g in sizes}
    while True:
        resp = http.get(f"/API/v1/queues/{name}/messages?ack=false")
        if resp.status != 200:
            business(resp, 400, "Failed to dequeue a message from a queue",
                     f"Queue is empty: {name}")
            break
        out = resp.json()
        delivered[out["group"]].append(out["priority"])
    assert {g: len(p) for g, p in delivered.items()} == {"a": 8, "b": 8, "c": 3, "d": 1}
    assert all(p == sorted(p) for p in delivered.values())     # priority order within a group
    assert counts(http, name) == (2, 20, 22)


def test_generate_ids(http: Http) -> None:
    for number in (1, 5, 1000):
        out = ok(http.post("/API/v1/ids", {"number": number}))
        assert set(out) == {"ids"} and len(out["ids"]) == number
        assert all(isinstance(i, str) and DECIMAL_ID.fullmatch(i) for i in out["ids"])
        values = [int(i) for i in out["ids"]]
        assert all(a < b for a, b in zip(values, values[1:]))
        assert values[-1] < 2 ** 63


def test_cluster_servers(http: Http, node: NodeProc) -> None:
    out = ok(http.get("/API/v1/cluster/servers"))
    assert out == {"servers": [{"id": "node-0", "addr": node.raft_addr,
                                "leader_addr": node.raft_addr, "is_leader": True,
                                "suffrage": "Voter", "http_addr": f"127.0.0.1:{node.http_port}",
                                "grpc_addr": "", "lag": 0, "connected": True}]}


def test_rates(http: Http) -> None:
    """10 enqueues, 5 dequeues, 3 acks, 2 nacks; window 10 -> 1.0 / 0.5 / 0.3 / 0.2 (§5.11).

    Exact values are safe: the counts land in one or two whole seconds, and both are inside the
    10 s window for as long as this waits (at most a few seconds).
    """
    name = unique("rates")
    create(http, name)
    for i in range(10):
        enqueue(http, name, i)
    delivered = [dequeue(http, name)["id"] for _ in range(5)]
    for mid in delivered[:3]:
        ok(http.post(f"/API/v1/queues/{name}/messages/{mid}/ack"))
    for mid in delivered[3:]:
        ok(http.post(f"/API/v1/queues/{name}/messages/{mid}/nack", {"priority": 0}))
    expected = {"enqueue_rps": 1.0, "dequeue_rps": 0.5, "ack_rps": 0.3, "nack_rps": 0.2}

    def rates() -> dict[str, float] | None:
        current = info(http, name)
        got = {k: current[k] for k in expected}
        return got if got == expected else None

    wait_until(rates, timeout=4, describe=lambda: json.dumps(info(http, name)))
    assert counts(http, name) == (7, 0, 7)
    # re-enqueueing an existing id is not counted as an enqueue
    enqueue(http, name, 1, id=delivered[3])
    wait_until(rates, timeout=2)


def test_ack_timeout_redelivery(aux_node: NodeProc) -> None:
    """Default ack timeout 2 s: an unacked message comes back by itself; a touch postpones it.

    A is delivered at t0 and B with it; B is touched at t0 + 1.5 s, so its deadline (>= t0 + 3.5)
    is well after the redelivery round that returns A (the first 1 s tick after t0 + 2 s).
    """
    http = aux_node.http()
    assert ok(http.get("/API/v1/queues")) == {"queues": []}
    name = unique("redeliver")
    create(http, name, "fair")
    assert info(http, name)["settings"] == {"strategy": "ROUND_ROBIN", "ack_timeout": 2}
    a = enqueue(http, name, 5, "again", group="ga", metadata={"m": "1"})["id"]
    b = enqueue(http, name, 5, "touched", group="gb")["id"]
    first = dequeue(http, name)
    t0 = time.monotonic()
    assert [first["id"], dequeue(http, name)["id"]] == [a, b]
    assert_empty(http, name)
    wait_until(lambda: time.monotonic() >= t0 + 1.5, timeout=3)
    assert_empty(http, name)                                   # nothing came back early
    assert ok(http.post(f"/API/v1/queues/{name}/messages/{b}/touch"))["status"] == "TOUCHED"

    def redelivered() -> dict[str, Any] | None:
        resp = http.get(f"/API/v1/queues/{name}/messages?ack=false")
        return strict_json(resp) if resp.status == 200 else None

    again = wait_until(redelivered, timeout=5, interval=0.1)
    assert time.monotonic() - t0 >= 1.9
    keys = ("id", "group", "priority", "content", "metadata")
    assert {k: again[k] for k in keys} == {k: first[k] for k in keys}
    assert_empty(http, name)                                   # B's touch postponed it
    assert counts(http, name) == (0, 2, 2)
    assert ok(http.post(f"/API/v1/queues/{name}/messages/{a}/ack"))["status"] == "ACKNOWLEDGED"
    assert wait_until(redelivered, timeout=5, interval=0.1)["id"] == b
    assert time.monotonic() - t0 >= 3.4
    assert ok(http.post(f"/API/v1/queues/{name}/messages/{b}/ack"))["status"] == "ACKNOWLEDGED"
    assert counts(http, name) == (0, 0, 0)
    http.close()


def test_bug_answers_500_and_changes_nothing(aux_node: NodeProc) -> None:
    """An operation that hits a bug in the state machine is rolled back alone; HTTP says 500."""
    http = aux_node.http()
    name = unique("fault")
    create(http, name, "fair")
    mid = enqueue(http, name, 3, "fine", group="g")["id"]
    before = snapshot(http, name, [mid])
    out = problem(http.post(f"/API/v1/queues/{name}/messages",
                            {"priority": 1, "content": "__doq_inject_fault__", "group": "g"}),
                  500, "Failed to enqueue a message")
    assert len(out["errors"]) == 1 and set(out["errors"][0]) == {"message"}
    assert snapshot(http, name, [mid]) == before
    assert dequeue(http, name, ack=True)["id"] == mid          # still serving
    http.close()


def test_no_leader_answers_503(leaderless: NodeProc) -> None:
    """Availability failures: 503 with the route's detail and the cause as the message."""
    http = leaderless.http()
    resp = http.get("/readyz")
    assert resp.status == 503 and "x-request-id" not in resp.headers
    assert http.get("/livez").status == 200
    assert http.get("/healthz").status == 200
    cases = [
        ("POST", "/API/v1/queues", {"name": "q", "type": "fair"}, "Failed to enqueue a message"),
        ("PUT", "/API/v1/queues/q", {"settings": {}}, "Failed to update a queue"),
        ("DELETE", "/API/v1/queues/q", None, "Failed to dequeue a message from a queue"),
        ("POST", "/API/v1/queues/q/messages", {"priority": 1, "content": "x"},
         "Failed to enqueue a message"),
        ("GET", "/API/v1/queues/q/messages", None, "Failed to dequeue a message from a queue"),
        ("GET", "/API/v1/queues/q/messages/1", None, "Failed to get a message from a queue"),
        ("DELETE", "/API/v1/queues/q/messages/1", None,
         "Failed to delete a message from a queue"),
        ("POST", "/API/v1/queues/q/messages/1/ack", None, "Failed to ack a message from a queue"),
        ("POST", "/API/v1/queues/q/messages/1/nack", {"priority": 0},
         "Failed to nack a message from a queue"),
        ("POST", "/API/v1/queues/q/messages/1/touch", None,
         "Failed to touch a message from a queue"),
        ("PUT", "/API/v1/queues/q/messages/1/priority", {"priority": 1},
         "Failed to update priority a message"),
    ]
    for method, path, body, detail in cases:
        business(http.request(method, path, body), 503, detail, "leader address is empty")
    # local reads still answer
    assert ok(http.get("/API/v1/queues")) == {"queues": []}
    assert_no_queue(http, "q")
    assert len(ok(http.post("/API/v1/ids", {"number": 3}))["ids"]) == 3
    # validation still comes first
    invalid(http.post("/API/v1/queues/q/messages", {"content": "x"}),
            "expected required property priority to be present", "body")
    http.close()


# == non-API routes, headers, metrics (SPEC §3.1, §3.5, §10) ====================================
def test_head_never_dequeues(http: Http) -> None:
    name = unique("head")
    create(http, name)
    mid = enqueue(http, name)["id"]
    for query in ("?ack=true", "?ack=false", ""):
        resp = http.request("HEAD", f"/API/v1/queues/{name}/messages{query}")
        assert resp.status == 405 and resp.body == b""
        assert resp.headers.get("allow") == "GET"
    assert counts(http, name) == (1, 0, 1)
    assert http.request("HEAD", f"/API/v1/queues/{name}").status == 200
    assert http.request("HEAD", f"/API/v1/queues/{name}/messages/{mid}").status == 200
    assert counts(http, name) == (1, 0, 1)
    assert dequeue(http, name, ack=True)["id"] == mid


def test_probes_and_health(http: Http) -> None:
    for path in ("/readyz", "/livez"):
        resp = http.get(path)
        assert (resp.status, resp.body) == (200, b"OK")
        assert "x-request-id" not in resp.headers           # answered before the middleware
    resp = http.get("/healthz")
    assert (resp.status, resp.body) == (200, b"OK")


def test_security_headers_and_request_id(http: Http) -> None:
    name = unique("hdr")
    create(http, name)
    responses = [
        http.get("/API/v1/queues"), http.get(f"/API/v1/queues/{name}"),
        http.get(f"/API/v1/queues/{name}/messages"),                         # a problem
        http.post(f"/API/v1/queues/{name}/messages", raw=b"{"),             # validation
        http.get("/healthz"), http.get("/metrics"), http.get("/some/page"),
        http.post("/no/such/path", {}),
    ]
    request_ids = set()
    for resp in responses:
        for header, value in SECURITY_HEADERS.items():
            assert resp.headers.get(header) == value, (header, resp.status, resp.headers)
        assert "content-security-policy" not in resp.headers
        assert "permissions-policy" not in resp.headers
        request_id = uuid.UUID(resp.headers["x-request-id"])
        assert request_id.version == 4 and request_id.variant == uuid.RFC_4122
        assert str(request_id) == resp.headers["x-request-id"]
        request_ids.add(str(request_id))
    assert len(request_ids) == len(responses)


def test_unknown_paths(http: Http) -> None:
    for path in ("/", "/queues/x", "/servers", "/API/v1/nothing/here"):
        resp = http.get(path)
        assert resp.status == 200 and resp.headers["content-type"].startswith("text/html")
        assert b"<html" in resp.body.lower()
    for method in ("POST", "PUT", "DELETE"):
        problem(http.request(method, "/no/such/path"), 404, "Not Found")
        problem(http.request(method, "/API/v1/nothing"), 404, "Not Found")
    # a known path with another method stays 405
    problem(http.put("/API/v1/ids", {"number": 1}), 405, "Method Not Allowed")
    problem(http.delete("/API/v1/queues"), 405, "Method Not Allowed")


def test_metrics(http: Http) -> None:
    name = unique("metrics")
    create(http, name)
    for _ in range(3):
        enqueue(http, name)
    mid = dequeue(http, name)["id"]
    ok(http.post(f"/API/v1/queues/{name}/messages/{mid}/ack"))
    dequeue(http, name)
    resp = http.get("/metrics")
    assert resp.status == 200 and resp.headers["content-type"].startswith("text/plain")
    text = resp.body.decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    q = f'{{queue_name="{name}"}}'
    assert samples[f"doq_queues_enqueue_total{q}"] == 3
    assert samples[f"doq_queues_dequeue_total{q}"] == 2
    assert samples[f"doq_queues_ack_total{q}"] == 1
    assert samples[f"doq_queues_nack_total{q}"] == 0
    assert samples[f"doq_queues_messages{q}"] == 2
    assert samples[f"doq_queues_unacked_messages{q}"] == 1
    assert samples[f"doq_queues_ready_messages{q}"] == 1
    http_lines = [k for k in samples if k.startswith("doq_http_requests_total{")]
    template = 'path="/API/v1/queues/<queue_name>/messages"'
    assert any(template in k and 'method="POST"' in k and 'status_code="200"' in k
               and 'service="doq"' in k for k in http_lines), http_lines
    assert not any(name in k for k in http_lines)             # templates, not raw paths
    assert not any('path="/metrics"' in k for k in http_lines)
    assert any(k.startswith("doq_http_request_duration_seconds_bucket{") for k in samples)


# == §3.1 validation table ========================================================================
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


@pytest.fixture(scope="module")
def victim(http: Http) -> Victim:
    queue = unique("victim")
    create(http, queue, "fair", {"max_unacked": 5, "ack_timeout": 600})
    unacked = enqueue(http, queue, 1, "u", group="g", metadata={"k": "u"})["id"]
    ready = enqueue(http, queue, 5, "r", group="g", metadata={"k": "r"})["id"]
    assert dequeue(http, queue)["id"] == unacked
    return Victim(queue, ready, unacked, unique("never"))


def rejected(http: Http, victim: Victim, method: str, path: str, **kw: Any) -> Response:
    """Send a request that must be rejected, and check it changed nothing."""
    before = victim.state(http)
    resp = http.request(method, victim.fill(path), **kw)
    assert victim.state(http) == before
    assert_no_queue(http, victim.new)
    return resp


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
    return json.dumps(_fill_body(victim, body)).encode()


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
    """Issue 12: a body without Content-Type was parsed as JSON, so a page elsewhere could
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
     {"priority": 1, "content": "x", "ttl": 5}, "unexpected property", "body.ttl"),
    # nack (of the unacked message)
    ("nack-missing-priority", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"metadata": {"a": "b"}}, "expected required property priority to be present", "body"),
    ("nack-priority-negative", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": -1}, "expected number >= 0", "body.priority"),
    ("nack-priority-string", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": "1"}, "expected integer", "body.priority"),
    ("nack-metadata-value", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": 1, "metadata": {"a": 1}}, "expected string", "body.metadata.a"),
    ("nack-metadata-type", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": 1, "metadata": "x"}, "expected object or null", "body.metadata"),
    ("nack-unknown-property", "POST", "/API/v1/queues/{q}/messages/{u}/nack",
     {"priority": 1, "delay": 5}, "unexpected property", "body.delay"),
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


def _fill_body(victim: Victim, body: Any) -> Any:
    if isinstance(body, dict):
        return {k: _fill_body(victim, v) for k, v in body.items()}
    if isinstance(body, str) and body == "{new}":
        return victim.new
    return body


@pytest.mark.parametrize("case,method,path,body,message,location", SCHEMA_CASES,
                         ids=[c[0] for c in SCHEMA_CASES])
def test_schema_validation_422(http: Http, victim: Victim, case: str, method: str, path: str,
                               body: Any, message: str, location: str) -> None:
    body = _fill_body(victim, body)
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


# == §3.3/§3.4 business errors ==================================================================
# (case id, method, path, body, status, detail, message template)
UNKNOWN_QUEUE_CASES = [
    ("enqueue", "POST", "/API/v1/queues/{new}/messages", {"priority": 1, "content": "x"}, 409,
     "Failed to enqueue a message", "Failed to get a queue: {new}"),
    ("dequeue", "GET", "/API/v1/queues/{new}/messages", None, 400,
     "Failed to dequeue a message from a queue", "Failed to get a queue: {new}"),
    ("dequeue-ack", "GET", "/API/v1/queues/{new}/messages?ack=true", None, 400,
     "Failed to dequeue a message from a queue", "Failed to get a queue: {new}"),
    ("get", "GET", "/API/v1/queues/{new}/messages/{u}", None, 400,
     "Failed to get a message from a queue", "Failed to get a queue: {new}"),
    ("delete", "DELETE", "/API/v1/queues/{new}/messages/{u}", None, 400,
     "Failed to delete a message from a queue", "Failed to get a queue: {new}"),
    ("ack", "POST", "/API/v1/queues/{new}/messages/{u}/ack", None, 400,
     "Failed to ack a message from a queue", "Failed to get a queue: {new}"),
    ("nack", "POST", "/API/v1/queues/{new}/messages/{u}/nack", {"priority": 1}, 400,
     "Failed to nack a message from a queue", "Failed to get a queue: {new}"),
    ("touch", "POST", "/API/v1/queues/{new}/messages/{u}/touch", None, 400,
     "Failed to touch a message from a queue", "Failed to get a queue: {new}"),
    ("update-priority", "PUT", "/API/v1/queues/{new}/messages/{u}/priority", {"priority": 1},
     409, "Failed to update priority a message", "Failed to get a queue: {new}"),
    ("queue-info", "GET", "/API/v1/queues/{new}", None, 400,
     "Failed to get stats for a queue", "queue not found"),
    ("update-queue", "PUT", "/API/v1/queues/{new}", {"settings": {"max_unacked": 1}}, 409,
     "Failed to update a queue", "Failed to update a queue: {new}"),
    ("delete-queue", "DELETE", "/API/v1/queues/{new}", None, 400,
     "Failed to dequeue a message from a queue", "Failed to delete a queue: {new}"),
]
# errors on the victim queue itself
MESSAGE_ERROR_CASES = [
    ("get-unknown-id", "GET", "/API/v1/queues/{q}/messages/1", None, 400,
     "Failed to get a message from a queue", "Failed to get a message from a queue: {q}"),
    ("get-uint64-max", "GET", "/API/v1/queues/{q}/messages/18446744073709551615", None, 400,
     "Failed to get a message from a queue", "Failed to get a message from a queue: {q}"),
    ("delete-unknown-id", "DELETE", "/API/v1/queues/{q}/messages/1", None, 400,
     "Failed to delete a message from a queue", "Failed to delete a message from a queue: {q}"),
    ("ack-ready", "POST", "/API/v1/queues/{q}/messages/{r}/ack", None, 400,
     "Failed to ack a message from a queue", "Message not found: {q}"),
    ("ack-unknown-id", "POST", "/API/v1/queues/{q}/messages/1/ack", None, 400,
     "Failed to ack a message from a queue", "Message not found: {q}"),
    ("nack-ready", "POST", "/API/v1/queues/{q}/messages/{r}/nack",
     {"priority": 99, "metadata": {"z": "z"}}, 400,
     "Failed to nack a message from a queue", "Message not found: {q}"),
    ("nack-unknown-id", "POST", "/API/v1/queues/{q}/messages/1/nack", {"priority": 0}, 400,
     "Failed to nack a message from a queue", "Message not found: {q}"),
    ("touch-ready", "POST", "/API/v1/queues/{q}/messages/{r}/touch", None, 400,
     "Failed to touch a message from a queue", "Message not found: {q}"),
    ("touch-unknown-id", "POST", "/API/v1/queues/{q}/messages/1/touch", None, 400,
     "Failed to touch a message from a queue", "Message not found: {q}"),
    ("update-priority-unknown-id", "PUT", "/API/v1/queues/{q}/messages/1/priority",
     {"priority": 1}, 409, "Failed to update priority a message",
     "Failed to dequeue a message from a queue: {q}"),
    ("update-queue-strategy", "PUT", "/API/v1/queues/{q}",
     {"settings": {"strategy": "weighted", "max_unacked": 1}}, 409, "Failed to update a queue",
     "Failed to update a queue: {q}: invalid queue settings"),
    ("create-invalid-combination", "POST", "/API/v1/queues",
     {"name": "{new}", "type": "delayed", "settings": {"strategy": "round_robin"}}, 409,
     "Failed to enqueue a message", "Failed to create a queue: {new}: invalid strategy"),
]


@pytest.mark.parametrize("case,method,path,body,status,detail,message",
                         UNKNOWN_QUEUE_CASES + MESSAGE_ERROR_CASES,
                         ids=[c[0] for c in UNKNOWN_QUEUE_CASES + MESSAGE_ERROR_CASES])
def test_business_errors(http: Http, victim: Victim, case: str, method: str, path: str,
                         body: Any, status: int, detail: str, message: str) -> None:
    resp = rejected(http, victim, method, path, body=_fill_body(victim, body))
    business(resp, status, detail, victim.fill(message))


def test_dequeue_queue_empty(http: Http) -> None:
    name = unique("empty")
    create(http, name, "fair")
    assert_empty(http, name)
    assert_empty(http, name, ack=True)
    mid = enqueue(http, name, group="g")["id"]
    dequeue(http, name)
    before = snapshot(http, name, [mid])
    assert_empty(http, name)                     # everything is in flight
    assert snapshot(http, name, [mid]) == before


def test_problem_bodies_carry_the_stable_error_code(http: Http) -> None:
    """The "code" extension member tells apart failures that share a status (doq_lib.client)."""
    name = unique("codes")
    create(http, name)
    codes = {
        "queue_empty": http.get(f"/API/v1/queues/{name}/messages"),
        "queue_not_found": http.get("/API/v1/queues/no-such-queue/messages"),
        "message_not_unacked": http.post(f"/API/v1/queues/{name}/messages/42/ack", {}),
        "message_not_found": http.get(f"/API/v1/queues/{name}/messages/42"),
        "invalid_argument": http.post("/API/v1/ids", {"number": 0}),
        "not_found": http.delete("/API/v1/no-such-route"),
    }
    for code, resp in codes.items():
        assert resp.status >= 400 and strict_json(resp)["code"] == code, (code, resp.body)


# -- batch enqueue (an extension: one request, one replicated operation) ----------------------

def test_enqueue_batch_stores_all_in_order(http: Http) -> None:
    name = unique("batch")
    create(http, name, "fair")
    messages = [{"content": f"m{i}", "priority": 5, "group": f"g{i % 2}"} for i in range(5)]
    messages[1]["metadata"] = {"k": "v"}
    messages[2]["id"] = "77"
    out = ok(http.post(f"/API/v1/queues/{name}/messages/batch", {"messages": messages}))
    assert out["status"] == "ENQUEUED" and len(out["ids"]) == 5
    assert out["ids"][2] == "77" and all(DECIMAL_ID.fullmatch(i) for i in out["ids"])
    for mid, sent in zip(out["ids"], messages):
        got = ok(http.get(f"/API/v1/queues/{name}/messages/{mid}"))
        assert (got["content"], got["group"]) == (sent["content"], sent["group"])
        assert got.get("metadata", {}) == sent.get("metadata", {})
    assert ok(http.get(f"/API/v1/queues/{name}"))["ready"] == 5


def test_enqueue_batch_is_all_or_nothing(http: Http) -> None:
    missing = unique("nope")
    resp = http.post(f"/API/v1/queues/{missing}/messages/batch",
                     {"messages": [{"content": "x", "priority": 1}]})
    business(resp, 409, "Failed to enqueue a message", f"Failed to get a queue: {missing}")
    name = unique("batch")
    create(http, name)
    bad = [{"content": "ok", "priority": 1}, {"content": "bad", "priority": -1}]
    invalid(http.post(f"/API/v1/queues/{name}/messages/batch", {"messages": bad}),
            "expected number >= 0", "body.messages[1].priority", value=-1)
    invalid(http.post(f"/API/v1/queues/{name}/messages/batch",
                      {"messages": [{"content": "x", "priority": 1, "id": "x1"}]}),
            "expected a decimal message id below 2^63", "body.messages[0].id", value="x1")
    invalid(http.post(f"/API/v1/queues/{name}/messages/batch", {"messages": []}),
            "expected at least 1 items", "body.messages", value=[])
    many = [{"content": "", "priority": 1}] * 1001
    invalid(http.post(f"/API/v1/queues/{name}/messages/batch", {"messages": many}),
            "expected at most 1000 items", "body.messages", value=1001)
    invalid(http.post(f"/API/v1/queues/{name}/messages/batch", {"messages": "x"}),
            "expected array", "body.messages", value="x")
    assert ok(http.get(f"/API/v1/queues/{name}"))["total"] == 0
