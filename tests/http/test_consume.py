"""Batch consume, long-poll and batch ack / nack over HTTP, against a real 3-node cluster.

``GET .../messages?count=N&wait=S``, ``POST .../messages/ack`` and ``POST .../messages/nack``
(SPEC §3). Every scenario runs through the leader and through a follower; every
refused request is checked to change nothing (the queue's counts and every message as GET by
id returns it).
"""
from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from typing import Any, Iterator

import pytest

from tests.harness import Cluster, Http, Response, message_body

MESSAGE_KEYS = {"status", "id", "group", "priority", "content", "metadata",
                "deliveries", "delivery"}   # dequeue answers (ack=false): count, token


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # A 3 s default ack timeout lets the redelivery wake-up be tested in seconds.
    c = Cluster(str(tmp_path_factory.mktemp("consume")), size=3,
                flags={"queue.default_acknowledgement_timeout": "3",
                       "queue.acknowledgement_check_interval": "1"}).start()
    try:
        c.leader()
        yield c
    finally:
        c.stop()


@pytest.fixture(params=["leader", "follower"])
def via(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[Http]:
    """The node the client talks to: the leader, or a follower (which forwards writes)."""
    node = cluster.leader() if request.param == "leader" else cluster.followers()[0]
    client = node.http(timeout=40)
    yield client
    client.close()


@pytest.fixture
def leader_http(cluster: Cluster) -> Iterator[Http]:
    client = cluster.leader().http(timeout=40)
    yield client
    client.close()


def ok(r: Response) -> Any:
    assert r.status == 200, (r.status, r.body)
    return r.json()


def make_queue(http: Http, qtype: str = "delayed", **settings: Any) -> str:
    name = unique(qtype)
    body: dict[str, Any] = {"name": name, "type": qtype}
    if settings:
        body["settings"] = settings
    ok(http.post("/API/v1/queues", body))
    return name


def enqueue(http: Http, queue: str, content: str, priority: int = 1, group: str = "",
            metadata: dict[str, str] | None = None) -> str:
    body = message_body(content, priority, group, metadata)
    return ok(http.post(f"/API/v1/queues/{queue}/messages", body))["id"]  # type: ignore


def info(http: Http, queue: str) -> dict[str, int]:
    body = ok(http.get(f"/API/v1/queues/{queue}"))
    return {"ready": body["ready"], "unacked": body["unacked"], "total": body["total"]}


def snapshot(http: Http, queue: str, ids: list[str]) -> Any:
    messages = {}
    for mid in ids:
        r = http.get(f"/API/v1/queues/{queue}/messages/{mid}")
        messages[mid] = (r.status, r.body)
    return info(http, queue), messages


def invalid(r: Response, location: str) -> dict[str, Any]:
    assert r.status == 422, (r.status, r.body)
    problem = r.json()
    assert problem["detail"] == "validation failed" and problem["code"] == "invalid_argument"
    assert location in [e.get("location") for e in problem["errors"]], problem
    return problem  # type: ignore[no-any-return]


def replicas_agree(cluster: Cluster) -> None:
    cluster.assert_replicas_identical()


class Background:
    """A request on its own connection and thread, timed from its start."""

    def __init__(self, http_port: int, path: str, method: str = "GET") -> None:
        self.result: Response | None = None
        self.error: BaseException | None = None
        self.answered_at = 0.0
        self.started = time.monotonic()

        def run() -> None:
            client = Http(http_port, timeout=40)
            try:
                self.result = client.request(method, path)
                self.answered_at = time.monotonic()
            except BaseException as exc:  # noqa: BLE001 - reported by get()
                self.error = exc
            finally:
                client.close()
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def get(self, timeout: float = 30) -> Response:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the request never answered"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    def pending(self) -> bool:
        return self.thread.is_alive()


# -- batch consume -------------------------------------------------------------------------------
def test_count_takes_up_to_n_in_delivery_order_with_the_single_answer_fields(
        via: Http, cluster: Cluster) -> None:
    queue = make_queue(via)
    sent = [enqueue(via, queue, f"m{p}", priority=p, group="", metadata={"n": str(p)})
            for p in (5, 3, 9, 1, 7)]
    single = ok(via.get(f"/API/v1/queues/{queue}/messages?ack=false"))       # priority 1
    assert single["id"] == sent[3]
    first = ok(via.get(f"/API/v1/queues/{queue}/messages?count=3"))
    assert list(first) == ["messages"]
    assert [m["content"] for m in first["messages"]] == ["m3", "m5", "m7"]
    for m in first["messages"]:
        assert set(m) == set(single) == MESSAGE_KEYS, (m, single)
        assert m["status"] == "DEQUEUED" and isinstance(m["id"], str)
        assert m["metadata"] == {"n": str(m["priority"])}
    rest = ok(via.get(f"/API/v1/queues/{queue}/messages?count=1000&ack=true"))
    assert [m["content"] for m in rest["messages"]] == ["m9"]
    assert info(via, queue) == {"ready": 0, "unacked": 4, "total": 4}
    assert ok(via.get(f"/API/v1/queues/{queue}/messages?count=5")) == {"messages": []}
    replicas_agree(cluster)


def test_count_on_a_fair_queue_keeps_fairness_and_the_group_field(via: Http) -> None:
    queue = make_queue(via, "fair")
    for n in range(3):
        for group in ("a", "b"):
            enqueue(via, queue, f"{group}{n}", priority=1, group=group)
    taken = ok(via.get(f"/API/v1/queues/{queue}/messages?count=4&ack=true"))["messages"]
    assert sorted(m["group"] for m in taken) == ["a", "a", "b", "b"]
    assert all(set(m) == MESSAGE_KEYS - {"metadata", "delivery"} for m in taken)   # acked


def test_count_and_wait_validation_changes_nothing(via: Http) -> None:
    queue = make_queue(via)
    ids = [enqueue(via, queue, "x")]
    before = snapshot(via, queue, ids)
    base = f"/API/v1/queues/{queue}/messages"
    for raw in ("0", "1001", "-1", "1.5", "abc", "", "%201", "1e2", "%D9%A3"):
        invalid(via.get(f"{base}?count={raw}"), "query.count")
    for raw in ("21", "20.001", "-1", "abc", "", "nan", "inf", "1e1", "0x1", "1,5"):
        invalid(via.get(f"{base}?wait={raw}"), "query.wait")
        invalid(via.get(f"{base}?count=2&wait={raw}"), "query.wait")
    invalid(via.get(f"{base}?count=2&ack=maybe"), "query.ack")
    assert snapshot(via, queue, ids) == before


def test_decimal_numbers_too_long_for_int_are_refused_not_crashed_on(via: Http) -> None:
    """Python's int() raises past 4,300 digits: such numbers get a 422, never a 500."""
    queue = make_queue(via)
    ids = [enqueue(via, queue, "x")]
    before = snapshot(via, queue, ids)
    huge = "9" * 5000
    base = f"/API/v1/queues/{queue}/messages"
    invalid(via.get(f"{base}?count={huge}"), "query.count")
    invalid(via.get(f"{base}/{huge}"), "path.id")
    invalid(via.post(f"{base}/{huge}/ack"), "path.id")
    invalid(via.post(base, {"content": "y", "priority": 1, "id": huge}), "body.id")
    for route in ("ack", "nack"):
        invalid(via.post(f"{base}/{route}", {"ids": [huge]}), "body.ids[0]")
    assert snapshot(via, queue, ids) == before


def test_count_on_a_missing_queue_answers_like_a_single_dequeue(via: Http) -> None:
    missing = unique("missing")
    plain = via.get(f"/API/v1/queues/{missing}/messages")
    for query in ("count=3", "count=3&wait=2", "wait=2"):
        started = time.monotonic()
        r = via.get(f"/API/v1/queues/{missing}/messages?{query}")
        assert time.monotonic() - started < 1.5, "an unknown queue must not be waited on"
        assert (r.status, r.json()) == (plain.status, plain.json()) and r.status == 400
        assert r.json()["code"] == "queue_not_found"


def test_without_count_and_wait_the_empty_answer_is_unchanged(via: Http) -> None:
    queue = make_queue(via)
    plain = via.get(f"/API/v1/queues/{queue}/messages")
    assert plain.status == 400 and plain.json()["code"] == "queue_empty"
    assert plain.json()["detail"] == "Failed to dequeue a message from a queue"
    waited = via.get(f"/API/v1/queues/{queue}/messages?wait=0.2")
    assert (waited.status, waited.json()) == (plain.status, plain.json())


def test_wait_without_count_answers_one_message(via: Http) -> None:
    queue = make_queue(via)
    mid = enqueue(via, queue, "one", metadata={"k": "v"})
    single = ok(via.get(f"/API/v1/queues/{queue}/messages?wait=1&ack=true"))
    assert single == {"status": "DEQUEUED", "id": mid, "group": "default", "priority": 1,
                      "content": "one", "metadata": {"k": "v"}, "deliveries": 1}


# -- long-poll -----------------------------------------------------------------------------------
def test_long_poll_times_out_empty(via: Http) -> None:
    queue = make_queue(via)
    for query, status in (("count=10&wait=0.6", 200), ("wait=0.6", 400)):
        started = time.monotonic()
        r = via.get(f"/API/v1/queues/{queue}/messages?{query}")
        assert time.monotonic() - started >= 0.55
        assert r.status == status, r.body
        if status == 200:
            assert r.json() == {"messages": []}
        else:
            assert r.json()["code"] == "queue_empty"


def test_long_poll_wakes_on_enqueue(via: Http, cluster: Cluster, leader_http: Http) -> None:
    queue = make_queue(via)
    poll = Background(via.port, f"/API/v1/queues/{queue}/messages?count=10&wait=15&ack=true")
    time.sleep(0.5)
    assert poll.pending()
    mid = enqueue(leader_http, queue, "late")
    enqueued = time.monotonic()
    body = ok(poll.get())
    assert [m["id"] for m in body["messages"]] == [mid]
    assert poll.answered_at - enqueued < 5, "woken by the enqueue, not by the 15 s timeout"
    assert info(via, queue)["total"] == 0


def test_long_poll_wakes_on_nack(via: Http, leader_http: Http) -> None:
    queue = make_queue(via)
    mid = enqueue(via, queue, "again")
    ok(via.get(f"/API/v1/queues/{queue}/messages?ack=false"))
    poll = Background(via.port, f"/API/v1/queues/{queue}/messages?wait=15&ack=false")
    time.sleep(0.5)
    assert poll.pending()
    ok(leader_http.post(f"/API/v1/queues/{queue}/messages/{mid}/nack", {"priority": 0}))
    nacked = time.monotonic()
    assert ok(poll.get())["id"] == mid
    assert poll.answered_at - nacked < 5


def test_long_poll_wakes_on_redelivery(via: Http) -> None:
    queue = make_queue(via)                      # the cluster's default ack timeout: 3 s
    mid = enqueue(via, queue, "timed out")
    ok(via.get(f"/API/v1/queues/{queue}/messages?ack=false"))
    started = time.monotonic()
    poll = Background(via.port, f"/API/v1/queues/{queue}/messages?count=2&wait=15")
    body = ok(poll.get())
    assert [m["id"] for m in body["messages"]] == [mid]
    assert 2.0 <= poll.answered_at - started < 10


def test_long_poll_wakes_when_an_ack_frees_a_fair_group(via: Http, leader_http: Http) -> None:
    queue = make_queue(via, "fair", max_unacked=1)
    first = enqueue(via, queue, "g1", group="g")
    second = enqueue(via, queue, "g2", group="g")
    assert ok(via.get(f"/API/v1/queues/{queue}/messages?ack=false"))["id"] == first
    poll = Background(via.port, f"/API/v1/queues/{queue}/messages?count=5&wait=15")
    time.sleep(0.5)
    assert poll.pending(), "the group is at its limit: nothing is deliverable"
    ok(leader_http.post(f"/API/v1/queues/{queue}/messages/{first}/ack"))
    acked = time.monotonic()
    assert [m["id"] for m in ok(poll.get())["messages"]] == [second]
    assert poll.answered_at - acked < 5


def test_long_poll_wakes_when_a_delayed_message_falls_due(via: Http) -> None:
    queue = make_queue(via)
    due = int(time.time()) + 2
    mid = enqueue(via, queue, "later", priority=due)
    assert ok(via.get(f"/API/v1/queues/{queue}/messages?count=1")) == {"messages": []}
    poll = Background(via.port, f"/API/v1/queues/{queue}/messages?count=1&wait=15&ack=true")
    body = ok(poll.get())
    assert [m["id"] for m in body["messages"]] == [mid]
    assert time.time() >= due - 0.01
    assert poll.answered_at - poll.started < 8


def test_many_waiters_each_get_distinct_messages(via: Http, leader_http: Http) -> None:
    queue = make_queue(via)
    polls = [Background(via.port, f"/API/v1/queues/{queue}/messages?count=2&wait=10&ack=true")
             for _ in range(6)]
    time.sleep(0.5)
    sent = {enqueue(leader_http, queue, f"w{n}") for n in range(6)}
    got: list[str] = []
    for poll in polls:
        got.extend(m["id"] for m in ok(poll.get())["messages"])
    assert len(got) == len(set(got)), "a message was delivered twice"
    assert set(got) <= sent
    rest = ok(via.get(f"/API/v1/queues/{queue}/messages?count=10&ack=true"))["messages"]
    assert set(got) | {m["id"] for m in rest} == sent


@pytest.mark.parametrize("ack", ["true", "false"])
def test_a_client_that_disconnects_while_waiting_takes_nothing(
        via: Http, leader_http: Http, ack: str) -> None:
    queue = make_queue(via)
    for query in (f"count=10&wait=10&ack={ack}", f"wait=10&ack={ack}"):
        sock = socket.create_connection(("127.0.0.1", via.port))
        sock.sendall(f"GET /API/v1/queues/{queue}/messages?{query} HTTP/1.1\r\n"
                     f"Host: 127.0.0.1\r\n\r\n".encode())
        time.sleep(0.5)
        sock.close()
        time.sleep(0.3)
        mid = enqueue(leader_http, queue, "kept")
        time.sleep(1.0)
        assert info(via, queue) == {"ready": 1, "unacked": 0, "total": 1}
        assert ok(via.get(f"/API/v1/queues/{queue}/messages?ack=true"))["id"] == mid


def test_a_waiting_request_still_answers_on_a_kept_alive_connection(via: Http) -> None:
    """The connection stays usable after a long-poll (timed out or woken)."""
    queue = make_queue(via)
    assert ok(via.get(f"/API/v1/queues/{queue}/messages?count=3&wait=0.3")) == {"messages": []}
    mid = enqueue(via, queue, "after")
    assert [m["id"] for m in ok(via.get(
        f"/API/v1/queues/{queue}/messages?count=3&wait=5"))["messages"]] == [mid]


# -- batch ack / nack ----------------------------------------------------------------------------
def test_batch_ack_with_good_and_bad_ids(via: Http, cluster: Cluster) -> None:
    queue = make_queue(via)
    ids = [enqueue(via, queue, f"a{n}", priority=n + 1) for n in range(4)]
    taken = [m["id"] for m in ok(via.get(
        f"/API/v1/queues/{queue}/messages?count=3"))["messages"]]
    assert taken == ids[:3]
    ready_id, unknown = ids[3], "987654321"
    before_ready = via.get(f"/API/v1/queues/{queue}/messages/{ready_id}").body
    body = ok(via.post(f"/API/v1/queues/{queue}/messages/ack",
                       {"ids": [taken[0], int(taken[1]), ready_id, unknown, taken[2]]}))
    assert body["acked"] == taken
    assert body["failed"] == [
        {"id": ready_id, "code": "message_not_unacked",
         "detail": f"message {ready_id} is not delivered and unacknowledged"},
        {"id": unknown, "code": "message_not_found",
         "detail": f"message {unknown} is not in queue {queue}"}]
    assert info(via, queue) == {"ready": 1, "unacked": 0, "total": 1}
    assert via.get(f"/API/v1/queues/{queue}/messages/{ready_id}").body == before_ready
    again = ok(via.post(f"/API/v1/queues/{queue}/messages/ack", {"ids": taken[:1]}))
    assert again["acked"] == [] and again["failed"][0]["code"] == "message_not_found"
    replicas_agree(cluster)


def test_batch_nack_gives_messages_back_with_priority_and_metadata(via: Http) -> None:
    queue = make_queue(via)
    ids = [enqueue(via, queue, f"n{n}", priority=10 + n, metadata={"v": "0"})
           for n in range(3)]
    ok(via.get(f"/API/v1/queues/{queue}/messages?count=2"))
    body = ok(via.post(f"/API/v1/queues/{queue}/messages/nack",
                       {"ids": [ids[1], ids[2]], "priority": 3, "metadata": {"v": "1"}}))
    assert body == {"nacked": [ids[1]], "failed": [{
        "id": ids[2], "code": "message_not_unacked",
        "detail": f"message {ids[2]} is not delivered and unacknowledged"}]}
    assert ok(via.get(f"/API/v1/queues/{queue}/messages/{ids[1]}"))["priority"] == 3
    assert ok(via.get(f"/API/v1/queues/{queue}/messages/{ids[1]}"))["metadata"] == {"v": "1"}
    untouched = ok(via.get(f"/API/v1/queues/{queue}/messages/{ids[2]}"))
    assert (untouched["priority"], untouched["metadata"]) == (12, {"v": "0"})
    assert info(via, queue) == {"ready": 2, "unacked": 1, "total": 3}
    keep = ok(via.post(f"/API/v1/queues/{queue}/messages/nack", {"ids": [int(ids[0])]}))
    assert keep == {"nacked": [ids[0]], "failed": []}
    kept = ok(via.get(f"/API/v1/queues/{queue}/messages/{ids[0]}"))
    assert (kept["priority"], kept["metadata"]) == (10, {"v": "0"})
    order = ok(via.get(f"/API/v1/queues/{queue}/messages?count=3&ack=true"))["messages"]
    assert [m["id"] for m in order] == [ids[1], ids[0], ids[2]]


@pytest.mark.parametrize("route", ["ack", "nack"])
def test_batch_settle_validation_changes_nothing(via: Http, route: str) -> None:
    queue = make_queue(via)
    ids = [enqueue(via, queue, f"v{n}") for n in range(2)]
    ok(via.get(f"/API/v1/queues/{queue}/messages?count=2"))
    before = snapshot(via, queue, ids)
    path = f"/API/v1/queues/{queue}/messages/{route}"
    cases: list[tuple[Any, str]] = [
        ({}, "body"), ({"ids": []}, "body.ids"), ({"ids": "1"}, "body.ids"),
        ({"ids": [ids[0]] * 1 + [str(n) for n in range(1, 1001)]}, "body.ids"),
        ({"ids": [ids[0], "abc"]}, "body.ids[1]"), ({"ids": [ids[0], -1]}, "body.ids[1]"),
        ({"ids": [ids[0], 1.5]}, "body.ids[1]"), ({"ids": [ids[0], True]}, "body.ids[1]"),
        ({"ids": [ids[0], None]}, "body.ids[1]"), ({"ids": [ids[0], 2 ** 64]}, "body.ids[1]"),
        ({"ids": [ids[0], " 1"]}, "body.ids[1]"), ({"ids": [ids[0], int(ids[0])]}, "body.ids[1]"),
        ({"ids": ids, "other": 1}, "body.other"),
    ]
    if route == "nack":
        cases += [({"ids": ids, "priority": -1}, "body.priority"),
                  ({"ids": ids, "metadata": {"k": 1}}, "body.metadata.k")]
    for body, location in cases:
        invalid(via.post(path, body), location)
    r = via.request("POST", path, raw=b'{"ids": [', headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.json()["errors"][0]["location"] == "body"
    r = via.request("POST", path, raw=json.dumps({"ids": ids}).encode(),
                    headers={"Content-Type": "text/plain"})
    assert r.status == 415, r.body
    missing = via.post(f"/API/v1/queues/{unique('missing')}/messages/{route}", {"ids": ids})
    assert missing.status == 400 and missing.json()["code"] == "queue_not_found"
    assert snapshot(via, queue, ids) == before


def test_a_batch_of_1000_is_one_operation_each_way(cluster: Cluster) -> None:
    leader = cluster.leader()
    http = leader.http(timeout=40)
    queue = make_queue(http)
    messages = [{"content": f"b{n}", "priority": 1} for n in range(1000)]
    sent = ok(http.post(f"/API/v1/queues/{queue}/messages/batch", {"messages": messages}))["ids"]

    def ops() -> int:
        return leader.status()["committer"]["ops_proposed"]  # type: ignore[no-any-return]
    before = ops()
    taken = ok(http.get(f"/API/v1/queues/{queue}/messages?count=1000"))["messages"]
    assert [m["id"] for m in taken] == sent
    body = ok(http.post(f"/API/v1/queues/{queue}/messages/ack", {"ids": sent}))
    assert body == {"acked": sent, "failed": []}
    # two operations, plus at most a few of the leader's own (clock ticks, redelivery rounds)
    assert 2 <= ops() - before <= 5
    assert info(http, queue) == {"ready": 0, "unacked": 0, "total": 0}
    http.close()
    replicas_agree(cluster)
