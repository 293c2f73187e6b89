"""Consumers the cluster knows, on a real 3-node cluster, through a
follower: dequeues name their consumer (HTTP ?consumer=, gRPC DequeueRequest.consumer, the
clients' default host:pid:program); GET .../consumers and GetConsumers list what each holds
and did, the same on every replica; browse and explain name the holder; the metric
doq_queue_consumers counts them."""
from __future__ import annotations

import asyncio
import itertools
import os
import socket
import urllib.parse
from typing import Any, Iterator

import grpc
import pytest

from doq_lib.client import connect, connect_async
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.cluster.test_metrics import scrape
from tests.harness import Cluster, Http, wait_until

pytestmark = pytest.mark.slow
_n = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("consumers")), size=3, flags={
        "grpc.address": "127.0.0.1:0", "prometheus.enabled": "true"}).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def via(cluster: Cluster) -> Iterator[Http]:
    yield cluster.followers()[0].http()
    cluster.assert_replicas_identical(timeout=30)


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, (r.status, r.body[:400])
    return r.json() if r.body else None


def fair_queue(http: Http, messages: int) -> str:
    name = f"cons-{next(_n)}"
    ok(http.post("/API/v1/queues", {"name": name, "type": "fair"}))
    ok(http.post(f"/API/v1/queues/{name}/messages/batch", {"messages": [
        {"content": str(n), "priority": 1, "group": f"g{n}"} for n in range(messages)]}))
    return name


def test_http_consumers_hold_and_settle(cluster: Cluster, via: Http) -> None:
    name = fair_queue(via, 4)
    base = f"/API/v1/queues/{name}/messages"
    got = ok(via.get(f"{base}?count=3&ack=false&consumer=host-a%3A1%3Aworker"))["messages"]
    other = ok(via.get(f"{base}?ack=false&consumer=host-b:2:worker"))
    ok(via.post(f"{base}/{got[0]['id']}/ack", {"delivery": got[0]["delivery"]}))
    ok(via.post(f"{base}/{got[1]['id']}/nack", {"delivery": got[1]["delivery"]}))
    listed = {c["name"]: c for c in ok(via.get(f"/API/v1/queues/{name}/consumers"))["consumers"]}
    assert sorted(listed) == ["host-a:1:worker", "host-b:2:worker"]
    a = listed["host-a:1:worker"]
    assert (a["held"], a["messages"], a["deliveries"], a["acks"], a["nacks"]) == \
        (1, [got[2]["id"]], 3, 1, 1)
    assert 0 <= a["oldest_lease_ms"] < 60_000 and a["last_seen"] > 0
    assert listed["host-b:2:worker"]["messages"] == [other["id"]]
    # every replica knows the same (replicated state)
    for node in cluster.nodes:
        there = ok(node.http().get(f"/API/v1/queues/{name}/consumers"))["consumers"]
        assert [(c["name"], c["held"], c["deliveries"], c["acks"]) for c in there] == \
            [(c["name"], c["held"], c["deliveries"], c["acks"]) for c in listed.values()]
    # browse and explain name the holder
    rows = ok(via.get(f"{base}?browse=true&state=unacked"))["messages"]
    holders = {r["id"]: r["consumer"] for r in rows}
    assert holders == {got[2]["id"]: "host-a:1:worker", other["id"]: "host-b:2:worker"}
    assert all(r["delivered_at"] > 0 for r in rows)
    explained = ok(via.get(f"{base}/{other['id']}/explain"))
    assert explained["state"] == "unacked"
    assert explained["held_by"]["consumer"] == "host-b:2:worker"
    assert explained["held_by"]["since"] == rows[[r["id"] for r in rows].index(
        other["id"])]["delivered_at"]
    # the metric
    wait_until(lambda: scrape(cluster.followers()[0]).get(
        ("doq_queue_consumers", frozenset({("queue_name", name)}))) == 2, timeout=10)


def test_grpc_names_its_consumer_and_lists_them(cluster: Cluster) -> None:
    follower = cluster.followers()[0]
    http = follower.http()
    name = fair_queue(http, 3)
    channel = grpc.insecure_channel(str(follower.status()["grpc_addr"]))
    try:
        stub = pb_grpc.DOQStub(channel)
        first = stub.Dequeue(pb.DequeueRequest(queueName=name, ack=False, consumer="rpc-1"))
        stream = stub.DequeueStream(iter([pb.DequeueRequest(
            queueName=name, ack=False, credit=2, consumer="stream-1")]))
        streamed = [next(stream), next(stream)]
        stream.cancel()
        out = stub.GetConsumers(pb.GetConsumersRequest(queueName=name))
        by_name = {c.name: c for c in out.consumers}
        assert sorted(by_name) == ["rpc-1", "stream-1"]
        assert list(by_name["rpc-1"].messages) == [first.id]
        assert sorted(by_name["stream-1"].messages) == sorted(m.id for m in streamed)
        assert by_name["stream-1"].deliveries == 2
        explained = stub.ExplainMessage(pb.ExplainRequest(queueName=name, id=first.id))
        assert (explained.state, explained.held_by) == ("unacked", "rpc-1")
        assert explained.held_since > 0
        with pytest.raises(grpc.RpcError) as info:
            stub.GetConsumers(pb.GetConsumersRequest(queueName="nope"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        channel.close()
    cluster.assert_replicas_identical(timeout=30)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_the_clients_name_their_consumers(cluster: Cluster, transport: str) -> None:
    follower = cluster.followers()[0]
    url = f"http://127.0.0.1:{follower.http_port}" if transport == "http" else \
        f"grpc://{follower.status()['grpc_addr']}"
    name = fair_queue(follower.http(), 3)
    with connect([url]) as client:
        message = client.dequeue(name)
        assert client.consumer.startswith(f"{socket.gethostname()}:{os.getpid()}:")
        with connect([url], consumer="billing-7") as named:
            taken = named.dequeue_many(name, 2)
            info = {c.name: c for c in named.consumers(name)}
        assert info[client.consumer].messages == [message.id]
        assert sorted(info["billing-7"].messages) == sorted(m.id for m in taken)
        page, _ = client.browse(name, "unacked")
        assert {b.message.id: b.consumer for b in page} == {
            message.id: client.consumer, **{m.id: "billing-7" for m in taken}}
        explained = client.explain(name, message.id)
        assert explained.held_by == client.consumer and explained.held_since > 0
    cluster.assert_replicas_identical(timeout=30)


@pytest.mark.parametrize("name", ["café", "工作者-1", "é" * 100, "ü" * 66 + "x" * 2])
def test_a_consumer_name_is_the_same_text_over_http_both_clients_and_grpc(
        cluster: Cluster, via: Http, name: str) -> None:
    """A name in UTF-8 (percent-encoded as browsers, urllib and curl send it, up to 200
    bytes) is stored as written, and is one consumer whichever transport names it: raw
    HTTP, the sync client, the asyncio client, gRPC."""
    queue = fair_queue(via, 5)
    base = f"/API/v1/queues/{queue}/messages"
    quoted = urllib.parse.quote(name, safe="")
    first = ok(via.get(f"{base}?ack=false&consumer={quoted}"))
    follower = cluster.followers()[0]
    sync = connect(f"http://127.0.0.1:{follower.http_port}", consumer=name)
    sync.dequeue(queue, ack=False)
    with grpc.insecure_channel(str(follower.status()["grpc_addr"])) as channel:
        pb_grpc.DOQStub(channel).Dequeue(pb.DequeueRequest(queueName=queue, consumer=name),
                                         timeout=10)

    async def by_asyncio() -> None:
        async with await connect_async(f"http://127.0.0.1:{follower.http_port}",
                                       consumer=name) as client:
            await client.dequeue(queue, ack=False)
    asyncio.run(by_asyncio())
    # The clients send to the leader; this follower answers from its own state once applied.
    wait_until(lambda: [(c["name"], c["held"]) for c in ok(via.get(
        f"/API/v1/queues/{queue}/consumers"))["consumers"]] == [(name, 4)], 10,
        describe=lambda: str(via.get(f"/API/v1/queues/{queue}/consumers").body[:400]))
    assert ok(via.get(f"{base}/{first['id']}/explain"))["held_by"]["consumer"] == name


@pytest.mark.parametrize("query, says", [
    ("%FF%FE", "not UTF-8"),                           # not UTF-8: refused, not guessed
    ("a%00b", "control character"),
    ("%C2%85x", "control character"),                  # U+0085, a C1 control character
    ("%C3%A9" * 101, "at most 200 bytes"),             # 202 bytes
])
def test_a_consumer_name_that_is_not_text_is_refused(via: Http, query: str,
                                                     says: str) -> None:
    queue = fair_queue(via, 1)
    r = via.get(f"/API/v1/queues/{queue}/messages?ack=false&consumer={query}")
    assert r.status in (400, 422) and says in r.body.decode(), (r.status, r.body[:300])
    info = ok(via.get(f"/API/v1/queues/{queue}"))
    assert (info["ready"], info["unacked"]) == (1, 0)            # nothing taken
