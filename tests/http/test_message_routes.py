"""Message routes, one at a time: enqueue (also in batches), dequeue, get, delete, ack, nack, touch,
priority, fair groups and max_unacked (SPEC §3.3; §12.2 handler tests)."""
from __future__ import annotations

import time

import pytest

from tests.harness import Http
from tests.http.shapes import (
    DECIMAL_ID,
    FALSE_SPELLINGS,
    INT64_MAX,
    MESSAGE_KEYS,
    TRUE_SPELLINGS,
    assert_empty,
    business,
    counts,
    create,
    dequeue,
    enqueue,
    get_message,
    invalid,
    ok,
    unique,
)


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
    token = out.pop("delivery")                   # the delivery's token: id, count, time
    assert token.startswith(f"{sent['id']}-1-")
    assert out == {"status": "DEQUEUED", "id": sent["id"], "group": "g", "priority": 3,
                   "content": "body", "metadata": {"a": "b"}, "deliveries": 1}
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
    token = dequeue(http, name)["delivery"]
    assert get_message(http, name, first["id"]) == {
        "status": "GOT", "id": first["id"], "group": "g", "priority": 1, "content": "one",
        "metadata": {"m": "1"}, "deliveries": 1, "delivery": token}  # delivered, not acked
    assert get_message(http, name, second["id"]) == {
        "status": "GOT", "id": second["id"], "group": "h", "priority": 2, "content": "two",
        "deliveries": 0}
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
    dequeue(http, name)
    # priority may be left out (the original required it): the message keeps its own
    assert ok(http.post(path, {})) == {"status": "UNACKNOWLEDGED", "id": mid, "priority": 3}
    assert counts(http, name) == (1, 0, 1)
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
