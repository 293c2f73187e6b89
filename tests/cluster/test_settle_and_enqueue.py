"""Settle and enqueue in one operation, on a real 3-node cluster, through a
follower: an ack, nack or reject with ``enqueue`` items stores them with the settle, or
nothing; and a chain of steps hands each result on exactly once across kill -9 of the
leader (every input ends acked with its one output, none with two)."""
from __future__ import annotations

import collections
import itertools
import threading
import time
from http.client import HTTPException
from typing import Any, Iterator

import grpc
import pytest

from doq_lib.client import connect
from doq_lib.errors import QueueNotFound, StaleDelivery
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.harness import Cluster, Http, NodeProc, wait_until

pytestmark = pytest.mark.slow
_n = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("chain")), size=3, flags={
        "grpc.address": "127.0.0.1:0"}).start()
    try:
        yield c
    finally:
        c.stop()


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, (r.status, r.body[:400])
    return r.json() if r.body else None


def queues(http: Http, *settings: dict[str, Any]) -> list[str]:
    names = []
    for s in settings:
        name = f"chain-{next(_n)}"
        ok(http.post("/API/v1/queues", {"name": name, "type": "delayed", "settings": s}))
        names.append(name)
    return names


def test_http_settles_store_their_results_or_nothing(cluster: Cluster) -> None:
    via = cluster.followers()[0].http()
    src, out, small, dlq = queues(via, {}, {}, {"max_messages": 1}, {})
    ok(via.put(f"/API/v1/queues/{src}", {"settings": {"dead_letter_queue": dlq}}))
    ok(via.post(f"/API/v1/queues/{small}/messages", {"content": "fills it", "priority": 1}))
    base = f"/API/v1/queues/{src}/messages"
    for n in range(4):
        ok(via.post(base, {"content": f"in{n}", "priority": n + 1}))
    item = {"queue": out, "content": "result", "priority": 1, "metadata": {"step": "2"}}

    def take() -> dict[str, Any]:
        return ok(via.get(f"{base}?ack=false"))  # type: ignore[no-any-return]

    def state() -> tuple[Any, ...]:
        return tuple(ok(via.get(f"/API/v1/queues/{q}"))["total"] for q in (src, out, dlq))

    first = take()
    answer = ok(via.post(f"{base}/{first['id']}/ack", {"delivery": first["delivery"],
                                                       "enqueue": [item, item]}))
    assert answer["status"] == "ACKNOWLEDGED" and len(answer["ids"]) == 2
    got = ok(via.get(f"/API/v1/queues/{out}/messages/{answer['ids'][0]}"))
    assert (got["content"], got["metadata"]) == ("result", {"step": "2"})
    # refused wholes: nothing changes
    second = take()
    before = state()
    r = via.post(f"{base}/{second['id']}/ack", {"delivery": second["delivery"],
                                                "enqueue": [item, {**item, "queue": "nope"}]})
    assert r.status == 400 and "nope" in r.body.decode(), r.body
    r = via.post(f"{base}/{second['id']}/ack", {"delivery": second["delivery"],
                                                "enqueue": [item, {**item, "queue": small}]})
    assert r.status == 429 and r.json()["code"] == "queue_full", r.body
    r = via.post(f"{base}/{second['id']}/ack", {"delivery": f"{second['id']}-9-1",
                                                "enqueue": [item]})
    assert r.status == 409 and r.json()["code"] == "stale_delivery"
    r = via.post(f"{base}/{second['id']}/ack", {"enqueue": [{"content": "no queue",
                                                             "priority": 1}]})
    assert r.status == 422 and "queue" in r.body.decode()
    r = via.post(f"{base}/{second['id']}/ack", {"enqueue": [item] * 101})
    assert r.status == 422 and "at most 100" in r.body.decode()
    assert state() == before
    # nack and reject carry items too
    answer = ok(via.post(f"{base}/{second['id']}/nack", {"delivery": second["delivery"],
                                                         "enqueue": [item]}))
    assert len(answer["ids"]) == 1
    third = take()
    answer = ok(via.post(f"{base}/{third['id']}/reject", {"delivery": third["delivery"],
                                                          "error": "bad", "enqueue": [item]}))
    assert answer["status"] == "REJECTED" and len(answer["ids"]) == 1
    assert state() == (before[0] - 1, before[1] + 2, before[2] + 1)
    cluster.assert_replicas_identical(timeout=30)


def test_grpc_and_the_clients_settle_and_enqueue(cluster: Cluster) -> None:
    follower = cluster.followers()[0]
    src, out = queues(follower.http(), {}, {})
    for n in range(4):
        ok(follower.http().post(f"/API/v1/queues/{src}/messages",
                                {"content": f"in{n}", "priority": n + 1}))
    channel = grpc.insecure_channel(str(follower.status()["grpc_addr"]))
    try:
        stub = pb_grpc.DOQStub(channel)
        taken = stub.Dequeue(pb.DequeueRequest(queueName=src))
        answer = stub.Ack(pb.AckRequest(queueName=src, id=taken.id, delivery=taken.delivery,
                                        enqueue=[pb.EnqueueRequest(queueName=out,
                                                                   content="r", priority=1)]))
        assert len(answer.ids) == 1
        again = stub.Dequeue(pb.DequeueRequest(queueName=src))
        with pytest.raises(grpc.RpcError) as info:
            stub.Ack(pb.AckRequest(queueName=src, id=again.id, delivery=again.delivery,
                                   enqueue=[pb.EnqueueRequest(queueName="nope", content="r",
                                                              priority=1)]))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in \
            info.value.details()
        stub.Nack(pb.NackRequest(queueName=src, id=again.id, delivery=again.delivery))
    finally:
        channel.close()
    for url in (f"http://127.0.0.1:{follower.http_port}",
                f"grpc://{follower.status()['grpc_addr']}"):
        with connect([url]) as client:
            message = client.dequeue(src)
            ids = client.ack(src, message.id, delivery=message.delivery,
                             enqueue=[{"queue": out, "content": "from client", "priority": 2}])
            assert len(ids) == 1 and client.get(out, ids[0]).content == "from client"
            message = client.dequeue(src)
            with pytest.raises(QueueNotFound):
                client.ack(src, message.id, delivery=message.delivery,
                           enqueue=[{"queue": "nope", "content": "x"}])
            with pytest.raises(StaleDelivery):
                client.ack(src, message.id, delivery=f"{message.id}-9-9",
                           enqueue=[{"queue": out, "content": "x"}])
            client.nack(src, message.id, delivery=message.delivery)
    cluster.assert_replicas_identical(timeout=30)


def test_the_clients_nack_reject_and_batch_ack_with_messages(cluster: Cluster) -> None:
    follower = cluster.followers()[0]
    src, out = queues(follower.http(), {}, {})
    for url in (f"http://127.0.0.1:{follower.http_port}",
                f"grpc://{follower.status()['grpc_addr']}"):
        with connect([url]) as client:
            for n in range(5):
                client.enqueue(src, f"in{n}", priority=n + 1)
            a, b, c = (client.dequeue(src) for _ in range(3))
            nacked = client.nack(src, a.id, delivery=a.delivery,
                                 enqueue=[{"queue": out, "content": "retry note"}])
            assert not nacked and len(nacked.ids) == 1      # given back, not dead-lettered
            ids = client.reject(src, b.id, delivery=b.delivery, error="bad",
                                enqueue=[{"queue": out, "content": "why", "priority": 4}])
            assert client.get(out, ids[0]).content == "why"
            d, e = client.dequeue(src), client.dequeue(src)
            done = client.ack_many(src, [c.id, d.id, e.id], [c.delivery, d.delivery, ""],
                                   enqueue=[[{"queue": out, "content": "c1"},
                                             {"queue": out, "content": "c2"}],
                                            [{"queue": "nope", "content": "d1"}], []])
            assert done.done == [c.id, e.id] and [f.id for f in done.failed] == [d.id]
            assert "nope" in done.failed[0].detail
            assert [client.get(out, i).content for i in done.enqueued[c.id]] == ["c1", "c2"]
            assert list(done.enqueued) == [c.id]
            client.nack(src, d.id, delivery=d.delivery)
            client.purge(src, include_unacked=True)
            # a delay on an enqueue and on a message a settle stores: held, then delivered
            held = client.enqueue(src, "in a second", delay=1)
            assert client.explain(src, held.id).reasons[0]["code"] == "delayed_until"
            wait_until(lambda c=client, m=held.id: c.explain(src, m).state == "ready", 15)
            got = client.dequeue(src)
            assert got.id == held.id and got.deliveries == 1
            ids = client.ack(src, got.id, delivery=got.delivery,
                             enqueue=[{"queue": out, "content": "later", "delay": 1}])
            assert client.explain(out, ids[0]).reasons[0]["code"] == "delayed_until"
            wait_until(lambda c=client, m=ids[0]: c.explain(out, m).state == "ready", 15)
            client.purge(out)
    cluster.assert_replicas_identical(timeout=30)


class Chain:
    """Workers that take from ``src`` and ack each message with its result for ``out`` in one
    operation, through any node, retrying an ack whose outcome is unknown with the same
    delivery token (an applied one answers 409: it is not applied twice)."""

    def __init__(self, nodes: list[NodeProc], src: str, out: str) -> None:
        self.nodes, self.src, self.out = nodes, src, out
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.settled: collections.Counter[str] = collections.Counter()   # input id -> 200s
        self.errors: collections.Counter[str] = collections.Counter()
        self.threads: list[threading.Thread] = []

    def worker(self, n: int) -> None:
        http = Http(self.nodes[n % len(self.nodes)].http_port, timeout=10)
        deadline = time.monotonic() + 150
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                r = http.get(f"/API/v1/queues/{self.src}/messages?ack=false&consumer=w{n}")
                if r.status != 200:
                    time.sleep(0.05)
                    continue
                msg = r.json()
                self._settle(http, msg)
            except (OSError, HTTPException) as exc:
                self.errors[type(exc).__name__] += 1
                http.close()
                n += 1
                http = Http(self.nodes[n % len(self.nodes)].http_port, timeout=10)
                time.sleep(0.1)

    def _settle(self, http: Http, msg: dict[str, Any]) -> None:
        body = {"delivery": msg["delivery"], "enqueue": [{
            "queue": self.out, "content": f"result of {msg['id']}", "priority": 1,
            "metadata": {"from": msg["id"]}}]}
        for _ in range(40):
            try:
                r = http.post(f"/API/v1/queues/{self.src}/messages/{msg['id']}/ack", body)
            except (OSError, HTTPException) as exc:
                self.errors[type(exc).__name__] += 1
                http.close()
                time.sleep(0.2)
                continue
            if r.status == 200:
                with self.lock:
                    self.settled[msg["id"]] += 1
                return
            if r.status == 409:                 # applied before, or its lease ran out
                return
            self.errors[f"ack {r.status}"] += 1
            time.sleep(0.2)

    def start(self, workers: int) -> None:
        self.threads = [threading.Thread(target=self.worker, args=(n,), daemon=True)
                        for n in range(workers)]
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def test_a_chain_hands_each_result_on_once_across_kill9_of_the_leader(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    count = 2000
    c = Cluster(str(tmp_path_factory.mktemp("chain-crash")), size=3, flags={
        "queue.default_acknowledgement_timeout": "3",
        "queue.acknowledgement_check_interval": "1"}).start()
    try:
        leader = c.leader()
        http = leader.http(timeout=60)
        for name in ("src", "out"):
            ok(http.post("/API/v1/queues", {"name": name, "type": "delayed"}))
        inputs: list[str] = []
        for start in range(0, count, 500):
            inputs += ok(http.post("/API/v1/queues/src/messages/batch", {"messages": [
                {"content": f"in{n}", "priority": 1} for n in range(start, start + 500)]}))["ids"]
        chain = Chain(c.nodes, "src", "out")
        chain.start(workers=8)
        wait_until(lambda: sum(chain.settled.values()) >= 500, 60, describe=c.describe)
        leader.kill()                                       # kill -9 with settles in flight
        wait_until(lambda: sum(chain.settled.values()) >= 1000, 60, describe=c.describe)
        leader.start()
        c.wait_ready(40)
        survivor = c.leader()
        wait_until(lambda: ok(survivor.http().get("/API/v1/queues/src"))["total"] == 0, 120,
                   describe=c.describe)
        chain.finish()
        c.assert_replicas_identical(timeout=30)
        # every input was acked with its one result: none twice, none without
        outputs: collections.Counter[str] = collections.Counter()
        reader = survivor.http(timeout=60)
        after = None
        while True:
            query = "browse=true&state=all&limit=1000" + (f"&after={after}" if after else "")
            page = ok(reader.get(f"/API/v1/queues/out/messages?{query}"))
            outputs.update(m["metadata"]["from"] for m in page["messages"])
            after = page["next"]
            if after is None:
                break
        assert set(outputs) == set(inputs), (len(set(outputs)), len(inputs))
        assert max(outputs.values()) == 1, [k for k, v in outputs.items() if v > 1][:5]
        assert all(v <= 1 for v in chain.settled.values())
        assert chain.errors, "the kill was not felt by any worker"
    finally:
        c.stop()
