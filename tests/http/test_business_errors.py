"""Business errors (SPEC §3.3, §3.4): unknown queues, messages in the wrong state, an empty
queue, and the stable error code of problem bodies."""
from __future__ import annotations

from typing import Any

import pytest

from tests.harness import Http
from tests.http.shapes import (
    Victim,
    assert_empty,
    business,
    create,
    dequeue,
    enqueue,
    fill_body,
    rejected,
    snapshot,
    strict_json,
    unique,
)

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
    resp = rejected(http, victim, method, path, body=fill_body(victim, body))
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
