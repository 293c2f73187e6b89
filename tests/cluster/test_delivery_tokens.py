"""Delivery tokens on a real 3-node cluster, through a follower: every delivery with ack=false
carries a token; a settle (ack, nack, touch, reject; single and batch; HTTP and gRPC; both
clients) with the token of a delivery that is no longer current — its lease ran out and the
message went to another consumer — is refused (409 stale_delivery / FAILED_PRECONDITION) and
changes nothing; the current token settles it. Without a token the original behaviour holds.
The replicas are compared after each test."""
from __future__ import annotations

import itertools
import time
from typing import Any, Iterator

import grpc
import pytest

from doq_lib.client import connect
from doq_lib.errors import StaleDelivery
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.harness import Cluster, Http, wait_until

pytestmark = pytest.mark.slow
ACK_TIMEOUT = 2                         # seconds: the nodes' default, so leases run out soon
_n = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("tokens")), size=3, flags={
        "queue.default_acknowledgement_timeout": str(ACK_TIMEOUT),
        "queue.acknowledgement_check_interval": "1",
        "grpc.address": "127.0.0.1:0"}).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def via(cluster: Cluster) -> Iterator[Http]:
    yield cluster.followers()[0].http()
    cluster.assert_replicas_identical(timeout=30)


@pytest.fixture
def stub(cluster: Cluster) -> Iterator[Any]:
    follower = cluster.followers()[0]
    channel = grpc.insecure_channel(str(follower.status()["grpc_addr"]))
    yield pb_grpc.DOQStub(channel)
    channel.close()
    cluster.assert_replicas_identical(timeout=30)


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, (r.status, r.body[:400])
    return r.json() if r.body else None


def queue_with_one(http: Http, qtype: str = "delayed") -> tuple[str, str]:
    name = f"tok-{next(_n)}"
    ok(http.post("/API/v1/queues", {"name": name, "type": qtype}))
    mid = ok(http.post(f"/API/v1/queues/{name}/messages", {"content": "job", "priority": 1,
                                                              "group": "g"}))["id"]
    return name, mid


def take(http: Http, name: str, wait: float = 0) -> dict[str, Any]:
    path = f"/API/v1/queues/{name}/messages?count=1&ack=false"
    if wait:
        path += f"&wait={wait}"
    got = ok(http.get(path))["messages"]
    assert len(got) == 1, got
    return got[0]  # type: ignore[no-any-return]


def lost_lease(http: Http, name: str) -> tuple[str, str, str]:
    """A first delivery whose lease runs out, then a second one: (id, old token, new)."""
    first = take(http, name)
    wait_until(lambda: given_back(http, name, first["id"]), timeout=20)
    second = take(http, name)
    assert second["id"] == first["id"] and second["deliveries"] == 2
    assert first["delivery"] != second["delivery"]
    return first["id"], first["delivery"], second["delivery"]


def given_back(http: Http, name: str, mid: Any) -> bool:
    """Whether message ``mid``'s lease ran out on the replica ``http`` reads: delivered
    before, not now. (A queue's ready count alone may still be the one from before a
    delivery another node made that this replica has not applied yet.)"""
    m = ok(http.get(f"/API/v1/queues/{name}/messages/{mid}"))
    return bool(m["deliveries"] >= 1 and not m.get("delivery"))


def stale(r: Any) -> None:
    assert r.status == 409, (r.status, r.body[:400])
    body = r.json()
    assert body["code"] == "stale_delivery" and "stale delivery" in body["detail"], body
    assert r.headers.get("content-type", "").startswith("application/problem+json")


def state(http: Http, name: str, mid: str) -> tuple[Any, ...]:
    q = ok(http.get(f"/API/v1/queues/{name}"))
    m = ok(http.get(f"/API/v1/queues/{name}/messages/{mid}"))
    return q["ready"], q["unacked"], m["priority"], m["deliveries"], m.get("delivery")


def test_http_settles_with_a_stale_token_are_refused_and_change_nothing(via: Http) -> None:
    name, _ = queue_with_one(via)
    mid, old, new = lost_lease(via, name)
    before = state(via, name, mid)
    assert before[4] == new                       # get shows the current delivery's token
    base = f"/API/v1/queues/{name}/messages/{mid}"
    stale(via.post(f"{base}/ack", {"delivery": old}))
    stale(via.post(f"{base}/ack?delivery={old}"))
    stale(via.post(f"{base}/nack", {"delivery": old, "error": "late"}))
    stale(via.post(f"{base}/touch?delivery={old}"))
    stale(via.post(f"{base}/reject", {"delivery": old}))
    for route, key in (("ack", "acked"), ("nack", "nacked")):
        out = ok(via.post(f"/API/v1/queues/{name}/messages/{route}",
                          {"ids": [{"id": mid, "delivery": old}]}))
        assert out[key] == [] and [f["code"] for f in out["failed"]] == ["stale_delivery"]
    assert state(via, name, mid) == before
    # the current delivery's token settles it; afterwards the message is gone: not found
    ok(via.post(f"{base}/touch", {"delivery": new}))
    ok(via.post(f"{base}/ack", {"delivery": new}))
    gone = via.post(f"{base}/ack", {"delivery": new})
    assert gone.status == 400 and "Message not found" in gone.body.decode(), gone.body
    assert ok(via.get(f"/API/v1/queues/{name}"))["unacked"] == 0


def test_http_without_a_token_settles_any_delivery_as_before(via: Http) -> None:
    name, _ = queue_with_one(via)
    mid, _, _ = lost_lease(via, name)
    # the original's clients send no token (and any body to ack is ignored, as before)
    ok(via.post(f"/API/v1/queues/{name}/messages/{mid}/ack", {"something": "else"}))
    r = via.post(f"/API/v1/queues/{name}/messages/{mid}/ack")
    assert r.status == 400 and r.json()["code"] == "message_not_unacked"


def test_http_batch_settles_fence_each_id(via: Http) -> None:
    name = f"tok-{next(_n)}"
    ok(via.post("/API/v1/queues", {"name": name, "type": "fair"}))
    ok(via.post(f"/API/v1/queues/{name}/messages/batch", {"messages": [
        {"content": str(n), "priority": 1, "group": f"g{n}"} for n in range(3)]}))
    got = ok(via.get(f"/API/v1/queues/{name}/messages?count=3&ack=false"))["messages"]
    wrong = f"{got[1]['id']}-7-1"                     # well formed, not the current delivery
    out = ok(via.post(f"/API/v1/queues/{name}/messages/ack", {"ids": [
        {"id": got[0]["id"], "delivery": got[0]["delivery"]},
        {"id": got[1]["id"], "delivery": wrong}, got[2]["id"]]}))
    assert out["acked"] == [got[0]["id"], got[2]["id"]]
    assert out["failed"] == [{"id": got[1]["id"], "code": "stale_delivery",
                              "detail": f"message {got[1]['id']}: stale delivery (delivered "
                                        "again or settled since); nothing changed"}]
    r = via.post(f"/API/v1/queues/{name}/messages/{got[1]['id']}/ack",
                 {"delivery": got[0]["delivery"]})
    assert r.status == 422 and "not of message" in r.body.decode()   # another message's


def test_nack_without_a_priority_keeps_it_and_takes_the_back_off(via: Http) -> None:
    """Item 4: the single nack route takes priority as optional."""
    name = f"tok-{next(_n)}"
    ok(via.post("/API/v1/queues", {"name": name, "type": "delayed", "settings": {
        "backoff_initial": 30, "backoff_max": 60}}))
    mid = ok(via.post(f"/API/v1/queues/{name}/messages", {"content": "c", "priority": 7}))["id"]
    token = take(via, name)["delivery"]
    out = ok(via.post(f"/API/v1/queues/{name}/messages/{mid}/nack", {"delivery": token}))
    assert out["priority"] == 7
    explained = ok(via.get(f"/API/v1/queues/{name}/messages/{mid}/explain"))
    assert [r["code"] for r in explained["reasons"]] == ["backoff_until"]
    until = explained["reasons"][0]["until"]
    assert 25_000 <= until - time.time() * 1000 <= 37_000     # 30 s and up to 20 % jitter


def test_grpc_settles_with_a_stale_token_are_refused(cluster: Cluster, stub: Any) -> None:
    http = cluster.followers()[0].http()
    name, _ = queue_with_one(http)
    first = stub.Dequeue(pb.DequeueRequest(queueName=name, ack=False))
    assert first.delivery.startswith(f"{first.id}-1-")
    wait_until(lambda: given_back(http, name, first.id), timeout=20)
    second = stub.Dequeue(pb.DequeueRequest(queueName=name, ack=False))
    assert second.id == first.id and second.deliveries == 2
    old, new, mid = first.delivery, second.delivery, first.id
    for call, request in (("Ack", pb.AckRequest(queueName=name, id=mid, delivery=old)),
                          ("Nack", pb.NackRequest(queueName=name, id=mid, delivery=old)),
                          ("Touch", pb.TouchRequest(queueName=name, id=mid, delivery=old)),
                          ("Reject", pb.RejectRequest(queueName=name, id=mid, delivery=old))):
        with pytest.raises(grpc.RpcError) as info:
            getattr(stub, call)(request)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, call
        assert "stale delivery" in info.value.details(), call
    out = stub.AckBatch(pb.AckBatchRequest(queueName=name, ids=[mid], deliveries=[old]))
    assert list(out.failed_ids) == [mid]
    assert stub.Get(pb.GetRequest(queueName=name, id=mid)).delivery == new
    for bad, why in (("garbage", "expected a delivery token"),
                     (f"{mid + 1}-2-5", "not of message")):
        with pytest.raises(grpc.RpcError) as info:
            stub.Ack(pb.AckRequest(queueName=name, id=mid, delivery=bad))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in \
            info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.AckBatch(pb.AckBatchRequest(queueName=name, ids=[mid], deliveries=[new, new]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stub.Touch(pb.TouchRequest(queueName=name, id=mid, delivery=new))
    out = stub.AckBatch(pb.AckBatchRequest(queueName=name, ids=[mid], deliveries=[new]))
    assert list(out.failed_ids) == []


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_the_clients_send_the_token_and_learn_they_lost_a_message(
        cluster: Cluster, transport: str) -> None:
    follower = cluster.followers()[0]
    http = follower.http()
    url = f"http://127.0.0.1:{follower.http_port}" if transport == "http" else \
        f"grpc://{follower.status()['grpc_addr']}"
    name, _ = queue_with_one(http)
    with connect([url]) as client:
        first = client.dequeue(name)
        assert first.delivery
        wait_until(lambda: given_back(http, name, first.id), timeout=20)
        second = client.dequeue(name)
        assert second.id == first.id and second.delivery != first.delivery
        with pytest.raises(StaleDelivery):
            client.touch(name, first.id, delivery=first.delivery)
        with pytest.raises(StaleDelivery):
            client.ack(name, first.id, delivery=first.delivery)
        with pytest.raises(StaleDelivery):
            client.nack(name, first.id, delivery=first.delivery)
        settled = client.ack_many(name, [first.id], [first.delivery])
        assert [f.code for f in settled.failed] == ["stale_delivery"]
        client.ack(name, second.id, delivery=second.delivery)
    cluster.assert_replicas_identical(timeout=30)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_consumer_acks_with_each_messages_token(cluster: Cluster, transport: str) -> None:
    follower = cluster.followers()[0]
    http = follower.http()
    url = f"http://127.0.0.1:{follower.http_port}" if transport == "http" else \
        f"grpc://{follower.status()['grpc_addr']}"
    name, _ = queue_with_one(http)
    with connect([url]) as client:
        consumer: Any = client.consume(name, prefetch=4, **({"wait": 1} if transport == "http"
                                                            else {}))
        first = consumer.receive(timeout=5)
        assert first is not None and first.delivery
        if transport == "grpc":
            # a stream keeps credit: it would take the message back itself as soon as its
            # lease ran out; end it (its ack still goes through the client)
            consumer.close()
        wait_until(lambda: given_back(http, name, first.id), timeout=20)
        again = client.dequeue(name)                 # another worker has it now
        if transport == "http":
            consumer.ack(first)                      # batched: the failure is kept
            consumer.flush()
            assert [f.code for f in consumer.failed] == ["stale_delivery"]
        else:
            with pytest.raises(StaleDelivery):
                consumer.ack(first)
        assert ok(http.get(f"/API/v1/queues/{name}"))["unacked"] == 1
        client.ack(name, again.id, delivery=again.delivery)
        consumer.close()
    cluster.assert_replicas_identical(timeout=30)
