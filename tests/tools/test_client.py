"""doq_lib.client against a real 3-node cluster, over HTTP and over gRPC, blocking and asyncio.

Both transports offer the same methods and raise the same error classes; clients find the
leader, and move to another node when theirs goes away. The asyncio client (``-async``) runs
the same tests through tests/blocking_aio.py, which drives each of its coroutines on an event
loop of its own.
"""
from __future__ import annotations

import itertools
import signal
import time
from typing import Any, Iterator

import pytest

from doq_lib.client import GrpcClient, HttpClient, RetryPolicy, connect
from doq_lib.errors import (
    InvalidArgument,
    InvalidSettings,
    MessageNotFound,
    NotApplied,
    NotUnacked,
    QueueEmpty,
    QueueNotFound,
    Unavailable,
)
from doq_lib.models import QueueType, Strategy
from tests.blocking_aio import KINDS, Blocking, open_client
from tests.harness import Cluster, NodeProc, wait_until

_names = itertools.count()
GRPC = {"grpc.address": "127.0.0.1:0"}


def http_url(node: NodeProc) -> str:
    return f"http://{node.host}:{node.http_port}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("cluster")), size=3, flags=GRPC).start()
    try:
        yield c
        c.assert_replicas_identical()
    finally:
        c.stop()


CLIENTS = list(KINDS)


@pytest.fixture(scope="module", params=CLIENTS)
def client(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[Any]:
    follower = cluster.followers()[0]
    c = open_client([http_url(follower)], request.param)
    try:
        yield c
    finally:
        c.close()


def qname() -> str:
    return f"cq{next(_names)}"


def test_a_whole_workflow(client: Any) -> None:
    name = qname()
    made = client.create_queue(name, "fair", Strategy.WEIGHTED, max_unacked=5, ack_timeout=60)
    assert (made.existed, made.type, made.settings.max_unacked) == (False, QueueType.FAIR, 5)
    again = client.create_queue(name, "delayed", ack_timeout=600)       # changes nothing
    assert (again.existed, again.type, again.settings.strategy, again.settings.max_unacked,
            again.settings.ack_timeout) == (True, QueueType.FAIR, Strategy.WEIGHTED, 5, 60)
    info = client.queue(name)
    assert (info.type, info.settings.strategy, info.settings.max_unacked,
            info.settings.ack_timeout) == (QueueType.FAIR, Strategy.WEIGHTED, 5, 60)
    client.update_queue(name, max_unacked=6)
    assert client.queue(name).settings.max_unacked == 6
    assert name in [q.name for q in client.queues()]

    m = client.enqueue(name, "hello", 3, group="g", metadata={"k": "v"})
    assert (m.content, m.priority, m.group, m.metadata) == ("hello", 3, "g", {"k": "v"})
    assert client.get(name, m.id).content == "hello"
    got = client.dequeue(name)
    assert got.id == m.id and got.metadata == {"k": "v"}
    client.touch(name, m.id)
    client.nack(name, m.id, priority=9, metadata={"k": "w"})
    again = client.dequeue(name)
    assert (again.id, again.priority, again.metadata) == (m.id, 9, {"k": "w"})
    client.ack(name, m.id)

    other = client.enqueue(name, "prio", 50, group="g")
    client.update_priority(name, other.id, 2)
    assert client.get(name, other.id).priority == 2
    client.delete(name, other.id)
    with pytest.raises(MessageNotFound):
        client.get(name, other.id)
    assert len(client.generate_ids(3)) == 3
    client.delete_queue(name)
    with pytest.raises(QueueNotFound):
        client.queue(name)


def test_the_same_error_classes_on_both_transports(client: Any) -> None:
    name = qname()
    client.create_queue(name)
    with pytest.raises(QueueNotFound):
        client.enqueue("missing-" + name, "x", 1)
    with pytest.raises(QueueEmpty):
        client.dequeue(name)
    m = client.enqueue(name, "x", 1)
    with pytest.raises(NotUnacked):
        client.ack(name, m.id)
    with pytest.raises(MessageNotFound):
        client.delete(name, m.id + 1)
    with pytest.raises(InvalidSettings):
        client.create_queue(qname(), "delayed", Strategy.WEIGHTED)
    with pytest.raises(InvalidArgument) as refused:
        client.create_queue(qname(), "delayed", ack_timeout=5)
    # the field the server named is kept (HTTP names it in the problem's errors[].location)
    text = str(refused.value)
    assert "ack_timeout" in text, text
    if isinstance(client, HttpClient):
        assert text.startswith("settings.ack_timeout: ") and "60" in text, text
    with pytest.raises(InvalidArgument):
        client.generate_ids(0)


def test_batches(client: Any) -> None:
    name = qname()
    client.create_queue(name)
    ids = client.enqueue_batch([{"queue": name, "content": f"b{i}", "priority": i}
                                for i in range(20)])
    assert [client.get(name, mid).content for mid in ids] == [f"b{i}" for i in range(20)]
    taken = [client.dequeue(name).id for _ in range(15)]
    assert taken == ids[:15]
    assert client.ack_batch(name, taken + [ids[19]]) == [ids[19]]
    assert client.queue(name).total == 5
    # one request per queue: a batch for a missing queue stores nothing, on both transports
    with pytest.raises(QueueNotFound):
        client.enqueue_batch([{"queue": qname(), "content": "x", "priority": 1}] * 3)
    big = client.enqueue_batch([{"queue": name, "content": f"z{i}", "priority": 1}
                                for i in range(1500)])
    assert len(set(big)) == 1500 and client.queue(name).total == 1505


@pytest.mark.parametrize("kind", CLIENTS)
def test_clients_find_the_leader(cluster: Cluster, kind: str) -> None:
    leader = cluster.leader()
    follower = cluster.followers()[0]
    with HttpClient([http_url(follower)], discover=False) as h:   # addresses are published
        wait_until(lambda: all(s.http_addr and s.grpc_addr for s in h.servers()), 10)  # soon
    with open_client(http_url(follower), kind) as c:
        assert c.transport == kind.split("-")[0]
        if c.transport == "http":
            assert c.node == f"{leader.host}:{leader.http_port}"
        else:
            assert c.node == leader.status()["grpc_addr"]
            assert len(c.nodes) == 3
    if kind == "grpc":
        with connect(http_url(follower), transport="grpc") as g:
            assert isinstance(g, GrpcClient)


@pytest.mark.parametrize("kind", ["grpc", "grpc-async"])
def test_a_grpc_consumer_receives_what_is_enqueued(cluster: Cluster,
                                                   kind: str) -> None:
    with open_client(http_url(cluster.nodes[0]), kind) as c:
        name = qname()
        c.create_queue(name)
        with c.consume(name, ack=False, prefetch=8) as consumer:
            assert consumer.receive(timeout=0.3) is None
            c.enqueue_batch([{"queue": name, "content": f"c{i}", "priority": i}
                             for i in range(30)])
            got = [consumer.receive(timeout=5) for _ in range(30)]
            assert [m.content for m in got if m] == [f"c{i}" for i in range(30)]
            assert c.ack_batch(name, [m.id for m in got if m]) == []
        assert c.queue(name).total == 0
        if kind == "grpc":                  # streams of enqueues: the blocking client's only
            streamed = list(c.enqueue_stream({"queue": name, "content": f"s{i}"}
                                             for i in range(10)))
            assert [m.content for m in streamed] == [f"s{i}" for i in range(10)]


def _grpc_client_of(node: NodeProc) -> GrpcClient:
    """A gRPC client that talks to ``node`` only (found through its HTTP API)."""
    addr = f"{node.host}:{node.http_port}"
    with HttpClient([http_url(node)]) as h:       # members publish their addresses soon
        wait_until(lambda: any(s.http_addr == addr and s.grpc_addr for s in h.servers()), 10)
        me = next(s for s in h.servers() if s.http_addr == addr)
    return GrpcClient([f"grpc://{me.grpc_addr}"])


def test_a_grpc_producer_pipelines_within_its_window(cluster: Cluster) -> None:
    """Through a follower: 400 sends, at most 16 unanswered at once, every future resolves
    to its own stored message, in order."""
    with _grpc_client_of(cluster.followers()[0]) as c:
        name = qname()
        c.create_queue(name)
        with c.producer(window=16) as producer:
            futures = [producer.send(name, f"p{i}", priority=i, metadata={"n": str(i)})
                       for i in range(400)]
            producer.flush(timeout=60)
            assert 2 <= producer.max_in_flight <= 16, producer.max_in_flight
            assert producer.in_flight == 0
        stored = [f.result(timeout=0) for f in futures]
        assert [(m.content, m.priority, m.metadata) for m in stored] == \
            [(f"p{i}", i, {"n": str(i)}) for i in range(400)]
        assert len({m.id for m in stored}) == 400
        assert c.queue(name).total == 400
        taken = c.dequeue_many(name, 400, ack=True)
        assert [(m.id, m.content) for m in taken] == [(m.id, m.content) for m in stored]
        with pytest.raises(InvalidArgument, match="closed"):
            producer.send(name, "after close")
        with pytest.raises(InvalidArgument, match="window"):
            c.producer(window=0)


def test_a_grpc_producer_stops_at_the_first_failure(cluster: Cluster) -> None:
    """The failed message's future raises the server's error; messages sent after it raise
    NotApplied and were not stored; the producer is broken afterwards. (The node is paused
    while the messages are sent, so that it reads them all at once.)"""
    node = cluster.followers()[0]
    with _grpc_client_of(node) as c:
        name = qname()
        c.create_queue(name)
        producer = c.producer(window=64)
        assert producer.send(name, "warm").result(timeout=30).content == "warm"
        node.signal(signal.SIGSTOP)
        try:
            good = [producer.send(name, f"g{i}") for i in range(5)]
            bad = producer.send(name + "-missing", "nowhere")
            later = [producer.send(name, f"l{i}") for i in range(5)]
        finally:
            node.signal(signal.SIGCONT)
        assert [f.result(timeout=30).content for f in good] == [f"g{i}" for i in range(5)]
        with pytest.raises(QueueNotFound, match="missing"):
            bad.result(timeout=30)
        for future in later:
            error = future.exception(timeout=30)
            assert isinstance(error, NotApplied) and "missing" in error.message, error
        with pytest.raises(QueueNotFound):
            producer.send(name, "after the failure")
        producer.close()
        assert sorted(m.content for m in c.dequeue_many(name, 100, ack=True)) == \
            [f"g{i}" for i in range(5)] + ["warm"]


def test_a_grpc_producer_with_a_full_window_refuses_to_send(cluster: Cluster) -> None:
    """While its node does not answer (SIGSTOP), the producer holds ``window`` messages and
    the next send fails after its timeout without being sent; once the node runs again the
    held messages are stored."""
    node = cluster.followers()[1]
    with _grpc_client_of(node) as c:
        name = qname()
        c.create_queue(name)
        producer = c.producer(window=2)
        assert producer.send(name, "warm").result(timeout=30).content == "warm"
        node.signal(signal.SIGSTOP)
        try:
            held = [producer.send(name, f"h{i}") for i in range(2)]
            started = time.monotonic()
            # Short: a follower paused for longer than the freshness window (0.5 s) refuses
            # writes until it hears from the leader again.
            with pytest.raises(Unavailable, match="window is full") as refused:
                producer.send(name, "no room", timeout=0.2)
            assert 0.15 < time.monotonic() - started < 5
            assert not refused.value.maybe_applied
            assert producer.in_flight == 2
        finally:
            node.signal(signal.SIGCONT)
        assert [f.result(timeout=30).content for f in held] == ["h0", "h1"]
        producer.close()
        assert sorted(m.content for m in c.dequeue_many(name, 10, ack=True)) == \
            ["h0", "h1", "warm"]


def test_take_many_and_settle_many(client: Any) -> None:
    """Both transports: dequeue_many (with a long-poll woken by an enqueue), ack_many,
    nack_many."""
    name = qname()
    client.create_queue(name)
    assert client.dequeue_many(name, 3) == []
    started = time.monotonic()
    assert client.dequeue_many(name, 3, wait=0.5) == []
    assert 0.45 <= time.monotonic() - started < 5
    ids = client.enqueue_batch([{"queue": name, "content": f"t{i}", "priority": i + 1}
                                for i in range(5)])
    taken = client.dequeue_many(name, 3, wait=5)
    assert [m.id for m in taken] == ids[:3] and taken[1].content == "t1"
    assert [m.id for m in client.dequeue_many(name, 1)] == [ids[3]]
    settled = client.ack_many(name, [ids[0], ids[4], ids[1]])
    assert settled.done == [ids[0], ids[1]] and [f.id for f in settled.failed] == [ids[4]]
    back = client.nack_many(name, [ids[2], ids[4]], priority=1)
    assert back.done == [ids[2]] and [f.id for f in back.failed] == [ids[4]]
    rest = client.dequeue_many(name, 10, ack=True)
    assert [m.id for m in rest] == [ids[2], ids[4]]
    assert client.ack_many(name, [ids[3]]).done == [ids[3]]
    assert client.queue(name).total == 0
    with pytest.raises(InvalidArgument):
        client.dequeue_many(name, 1001)


@pytest.mark.parametrize("kind", ["http", "http-async"])
def test_http_batch_take_and_settle(cluster: Cluster, kind: str) -> None:
    with open_client([http_url(cluster.followers()[0])], kind) as c:
        name = qname()
        c.create_queue(name)
        assert c.dequeue_many(name, 5) == []
        started = time.monotonic()
        assert c.dequeue_many(name, 5, wait=0.5) == []
        assert time.monotonic() - started >= 0.45
        ids = c.enqueue_batch([{"queue": name, "content": f"d{i}", "priority": i + 1,
                                "metadata": {"i": str(i)}} for i in range(6)])
        taken = c.dequeue_many(name, 4)
        assert [m.id for m in taken] == ids[:4]
        assert taken[2].content == "d2" and taken[2].metadata == {"i": "2"}
        settled = c.ack_many(name, [ids[0], ids[1], ids[5], ids[1]])
        assert settled.done == [ids[0], ids[1]]
        assert [(f.id, f.code) for f in settled.failed] == [(ids[5], "message_not_unacked")]
        back = c.nack_many(name, [ids[2], ids[0]], priority=100, metadata={"n": "1"})
        assert back.done == [ids[2]] and back.failed[0].code == "message_not_found"
        assert c.get(name, ids[2]).priority == 100 and c.get(name, ids[2]).metadata == {"n": "1"}
        assert c.ack_batch(name, [ids[3], ids[4]]) == [ids[4]]
        rest = c.dequeue_many(name, 10, ack=True, wait=2)
        assert [m.id for m in rest] == [ids[4], ids[5], ids[2]]
        with pytest.raises(QueueNotFound):
            c.dequeue_many(qname(), 3, wait=1)
        with pytest.raises(InvalidArgument):
            c.dequeue_many(name, 1001)


@pytest.mark.parametrize("kind", ["http", "http-async"])
def test_an_http_consumer_prefetches_and_gives_back_what_it_did_not_take(
        cluster: Cluster, kind: str) -> None:
    with open_client([http_url(cluster.nodes[0])], kind) as c:
        name = qname()
        c.create_queue(name)
        with c.consume(name, prefetch=8, wait=1) as consumer:
            assert consumer.receive(timeout=0.3) is None
            c.enqueue_batch([{"queue": name, "content": f"h{i}", "priority": i + 1}
                             for i in range(20)])
            got = []
            for _ in range(12):
                message = consumer.receive(timeout=5)
                assert message is not None
                got.append(message)
                consumer.ack(message.id)
            assert [m.content for m in got] == [f"h{i}" for i in range(12)]
        # 12 acked; of the 16 fetched (two batches of 8) the 4 not received were nacked
        info = c.queue(name)
        assert (info.total, info.unacked, info.ready) == (8, 0, 8)
        assert consumer.failed == []
        with c.consume(name, ack=True, prefetch=100, wait=0.2) as eager:
            contents = [eager.receive(timeout=2) for _ in range(8)]
        assert [m.content for m in contents if m] == [f"h{i}" for i in range(12, 20)]
        assert c.queue(name).total == 0


# -- failover (a cluster of its own: nodes get killed) ---------------------------------------------
@pytest.fixture()
def fragile(tmp_path: Any) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path), size=3, flags=GRPC).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_client_moves_on_when_its_node_dies(fragile: Cluster,
                                              kind: str) -> None:
    urls = [http_url(n) for n in fragile.nodes]
    with open_client(urls, kind) as c:
        name = qname()
        c.create_queue(name)
        ids = [c.enqueue(name, f"before{i}", 1, id=1000 + i).id for i in range(5)]
        leader = fragile.leader()
        leader.kill()                                     # the node the client talks to
        start = time.monotonic()
        # Writes that surely did not apply are retried on other nodes; one whose outcome is
        # unknown is retried here with the same id, which never makes a second copy.
        for i in range(5, 10):
            for _ in range(10):
                try:
                    ids.append(c.enqueue(name, f"after{i}", 1, id=1000 + i).id)
                    break
                except Unavailable as exc:
                    assert exc.maybe_applied
            else:
                pytest.fail("enqueue never succeeded after the leader died")
        assert time.monotonic() - start < 15
        assert c.node != f"{leader.host}:{leader.http_port}"
        wait_until(lambda: c.queue(name).total == 10, 10)
        assert sorted(m.id for m in (c.get(name, i) for i in ids)) == list(range(1000, 1010))


@pytest.mark.parametrize("kind", CLIENTS)
def test_without_quorum_calls_fail_with_unavailable(fragile: Cluster,
                                                    kind: str) -> None:
    survivor = fragile.followers()[0]
    name = qname()
    with open_client(http_url(survivor), kind,
                     retry=RetryPolicy(attempts=2, deadline=3)) as c:
        c.create_queue(name)
        for node in fragile.nodes:
            if node is not survivor:
                node.kill()
        wait_until(lambda: not survivor.ready(), 10)
        with pytest.raises(Unavailable):
            c.enqueue(name, "nobody will store this", 1)
        assert c.queue(name).total == 0                 # reads of the local replica still work


def test_a_delivered_message_settles_itself_on_both_transports(client: Any) -> None:
    """The consumer API is the same over HTTP and gRPC: messages with .json(), .ack(),
    .nack(error=, delay=), .touch(), .reject(error=), each sending the delivery's token; one
    prefetch default."""
    from doq_lib.client import Delivered
    from doq_lib.client.delivered import AsyncDelivered
    from doq_lib.client.subscriptions import PREFETCH
    from doq_lib.errors import NotUnacked

    name, dead = qname(), qname()
    client.create_queue(dead)
    client.create_queue(name, max_deliveries=5, dead_letter_queue=dead)
    client.create_queue(name + "-out")
    for n in range(5):
        client.enqueue(name, f'{{"n": {n}}}', priority=n + 1, metadata={"k": str(n)})
    consumer = client.consume(name, **({"wait": 1} if client.transport == "http" else {}))
    assert consumer._prefetch == PREFETCH == 64
    with consumer:
        got = [consumer.receive(timeout=10) for _ in range(5)]
        assert all(isinstance(m.target, AsyncDelivered) if isinstance(m, Blocking) else
                   isinstance(m, Delivered) for m in got)
        a, b, c, d, e = got
        assert (a.json(), a.metadata["k"], a.deliveries, a.queue) == ({"n": 0}, "0", 1, name)
        a.touch()
        assert a.ack(enqueue=[{"queue": name + "-out", "content": "result"}]) != []
        with pytest.raises(NotUnacked):
            a.ack()                                   # settled already: gone, not twice
        assert b.nack(error="flaky", delay=0) is False
        assert c.reject(error="bad input") == []
        d.ack()
        again = consumer.receive(timeout=10)          # b, back at once with its error
        assert (again.id, again.deliveries, again.last_error) == (b.id, 2, "flaky")
        again.ack()
        e.ack()
    assert client.queue(name).total == 0
    assert client.queue(dead).total == 1 and client.queue(name + "-out").total == 1


def test_a_message_taken_without_an_ack_settles_itself(client: Any) -> None:
    """``dequeue`` and ``dequeue_many`` with ack=False hand out messages that settle
    themselves as a consumer's do (sync and asyncio, HTTP and gRPC); with ack=True the
    message is settled already and stays a plain Message."""
    from doq_lib.client import Delivered
    from doq_lib.client.delivered import AsyncDelivered
    from doq_lib.errors import NotUnacked
    from doq_lib.models import Message

    def delivered(m: Any) -> bool:
        return isinstance(m.target, AsyncDelivered) if isinstance(m, Blocking) else \
            isinstance(m, Delivered)

    name, dead = qname(), qname()
    client.create_queue(dead)
    client.create_queue(name, dead_letter_queue=dead)
    for n in range(6):
        client.enqueue(name, f'{{"n": {n}}}', priority=n + 1)
    a = client.dequeue(name)
    assert delivered(a) and a.queue == name and a.json() == {"n": 0}
    a.touch()
    a.ack()
    with pytest.raises(NotUnacked):
        a.ack()
    b, c, d = client.dequeue_many(name, 3)
    assert all(delivered(m) for m in (b, c, d)) and [m.json()["n"] for m in (b, c, d)] == [1, 2, 3]
    assert b.nack(error="later") is False
    assert c.reject(error="bad") == []
    d.ack()
    again = client.dequeue(name)
    assert (again.id, again.last_error) == (b.id, "later")
    again.ack()
    acked = client.dequeue(name, ack=True)
    taken = client.dequeue_many(name, 5, ack=True)
    for m in (acked, *taken):
        plain = m.target if isinstance(m, Blocking) else m
        assert type(plain) is Message and not hasattr(plain, "ack")
    assert client.queue(name).total == 0 and client.queue(dead).total == 1


def test_the_client_needs_none_of_the_servers_packages(tmp_path: Any) -> None:
    """A program that only sends or consumes imports the client, the asyncio client and the
    task API without gevent, lmdb, pysyncobj (or the rest of the server's packages), and
    nothing it imports patches; a blocking program does not load the asyncio client."""
    import subprocess
    import sys

    from tests.harness import REPO

    script = tmp_path / "client_only.py"
    script.write_text(
        "import sys, threading, socket\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('gevent', 'greenlet', 'lmdb', 'pysyncobj',\n"
        "                                  'bottle', 'httptools', 'croniter', 'textual',\n"
        "                                  'prometheus_client'):\n"
        "            raise ImportError('the server package ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "thread, sock = threading.Thread, socket.socket\n"
        "import doq_lib.client, doq_lib.client.delivered, doq_lib.client.schedules\n"
        "from doq_lib.client import connect, Delivered\n"
        "assert 'aiohttp' not in sys.modules and 'doq_lib.client.aio' not in sys.modules\n"
        "from doq_lib.client import connect_async, AsyncHttpClient\n"
        "import doq_lib.client.aio, doq_lib.tasks\n"
        "assert threading.Thread is thread and socket.socket is sock, 'patched'\n"
        "print('ok', len([m for m in sys.modules if m.startswith('doq_lib')]))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=REPO, timeout=60, env={"PYTHONPATH": REPO, "PATH": "/usr/bin"})
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-2000:]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_one_asyncio_client_serves_many_coroutines_at_once(cluster: Cluster,
                                                           transport: str) -> None:
    """The asyncio client as programs use it: 300 enqueues gathered on one client through a
    follower, then ``async for`` over a consumer that acks each message, then settles of
    messages taken by dequeue_many, all on one event loop."""
    import asyncio

    from doq_lib.client import connect_async
    from doq_lib.client.delivered import AsyncDelivered

    name = qname()

    async def main() -> None:
        async with await connect_async(http_url(cluster.followers()[0]),
                                       transport=transport) as c:
            await c.create_queue(name, max_unacked=0)
            sent = await asyncio.gather(*(c.enqueue(name, f'{{"n": {i}}}', priority=i + 1)
                                          for i in range(300)))
            assert len({m.id for m in sent}) == 300
            seen: list[int] = []
            async with c.consume(name, prefetch=16) as consumer:
                assert consumer.__aiter__() is consumer
                async for message in consumer:
                    assert isinstance(message, AsyncDelivered)
                    seen.append(message.json()["n"])
                    if len(seen) % 2:
                        await message.ack()
                    else:
                        await consumer.ack(message)
                    if len(seen) == 250:
                        break
            assert sorted(seen) == list(range(250))
            if transport == "http":
                await consumer.flush()                # (closed: acks were sent at close)
            rest = await c.dequeue_many(name, 100, wait=5)
            assert sorted(int(m.content[6:-1]) for m in rest) == list(range(250, 300))
            settled = await c.ack_many(name, [m.id for m in rest],
                                       [m.delivery for m in rest])
            assert len(settled.done) == 50 and settled.failed == []
            assert (await c.queue(name)).total == 0
            assert await c.consume(name).receive(timeout=0.2) is None

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["grpc", "grpc-async"])
def test_a_grpc_take_moves_on_when_its_node_dies(fragile: Cluster, kind: str) -> None:
    """dequeue_many over gRPC is a short stream; a node that cannot be reached took
    nothing, so the take moves to the next node (as unary calls do)."""
    with open_client([http_url(n) for n in fragile.nodes], kind) as c:
        name = qname()
        c.create_queue(name)
        c.enqueue_batch([{"queue": name, "content": f"t{i}", "priority": i + 1}
                         for i in range(5)])
        before = c.node
        gone = next(n for n in fragile.nodes if n.status()["grpc_addr"] == before)
        gone.kill()                                       # the node the client talks to
        taken: list[Any] = []
        deadline = time.monotonic() + 20
        while len(taken) < 5 and time.monotonic() < deadline:  # (empty during the election)
            taken += c.dequeue_many(name, 10, ack=True, wait=1)
        assert [m.content for m in taken] == [f"t{i}" for i in range(5)]
        assert c.node != before
