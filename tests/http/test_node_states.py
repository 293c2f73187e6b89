"""Cluster routes and the node's states: ids, servers, rates, redelivery after the ack timeout,
a bug contained as a 500, and no leader as a 503."""
from __future__ import annotations

import json
import time
from typing import Any

from tests.harness import Http, NodeProc, wait_until
from tests.http.shapes import (
    DECIMAL_ID,
    assert_empty,
    assert_no_queue,
    business,
    counts,
    create,
    dequeue,
    enqueue,
    info,
    invalid,
    ok,
    problem,
    snapshot,
    strict_json,
    unique,
)


def test_generate_ids(http: Http) -> None:
    for number in (1, 5, 1000):
        out = ok(http.post("/API/v1/ids", {"number": number}))
        assert set(out) == {"ids"} and len(out["ids"]) == number
        assert all(isinstance(i, str) and DECIMAL_ID.fullmatch(i) for i in out["ids"])
        values = [int(i) for i in out["ids"]]
        assert all(a < b for a, b in zip(values, values[1:]))
        assert values[-1] < 2 ** 63


def test_cluster_servers(http: Http, node: NodeProc) -> None:
    out = wait_until(lambda: (lambda got: got if got["cluster_id"] else None)(
        ok(http.get("/API/v1/cluster/servers"))), 10)
    cluster_id = out.pop("cluster_id")                   # named by its first leader
    assert len(cluster_id) == 32 and cluster_id == node.status()["cluster_id"]
    assert out == {"servers": [{"id": "node-0", "addr": node.raft_addr,
                                "leader_addr": node.raft_addr, "is_leader": True,
                                "suffrage": "Voter", "http_addr": f"127.0.0.1:{node.http_port}",
                                "grpc_addr": "", "lag": 0, "connected": True,
                                # nothing advertised: clients use the nodes' own addresses
                                "peer_http_addr": f"127.0.0.1:{node.http_port}",
                                "peer_grpc_addr": ""}]}


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
