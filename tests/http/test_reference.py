"""The reference implementation's end-to-end suite (SPEC §12.1) over REST, on the package's
node. The pair ``test_regular_queue`` -> ``test_delayed_queue`` shares a queue, as the
reference suite does."""
from __future__ import annotations

import json
import time
from typing import Any, Iterator

import pytest

from tests.harness import Http, wait_until
from tests.http.shapes import (
    assert_empty,
    dequeue,
    enqueue,
    get_message,
    ok,
    unique,
)

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
        assert got == {"status": "GOT", "id": mid, **message, "deliveries": 0}
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
