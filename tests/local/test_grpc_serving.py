"""gRPC served in the node's event loop: what it must keep — cancellation, half-close,
shutdown, many calls at once — and the stream handlers' inbox. (tests/grpc/test_api.py runs
the whole API; tests/grpc/test_hub.py the HTTP/2 level.)"""
from __future__ import annotations

import queue
import signal
import threading
import time
from typing import Any, Iterator

import grpc
import pytest

from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.harness import Cluster, NodeProc, wait_until

pytestmark = pytest.mark.slow


def grpc_addr(node: NodeProc) -> str:
    return str(node.status()["grpc_addr"])


FLAGS = {"grpc.address": "127.0.0.1:0"}


@pytest.fixture()
def node(tmp_path: Any) -> Iterator[NodeProc]:
    c = Cluster(str(tmp_path), size=1, flags=FLAGS).start()
    try:
        yield c.nodes[0]
    finally:
        c.stop()


def _queue(stub: pb_grpc.DOQStub, name: str) -> None:
    stub.CreateQueue(pb.CreateQueueRequest(name=name, type="delayed",
                                           settings=pb.QueueSettings(ack_timeout=600)))


def _counts(stub: pb_grpc.DOQStub, name: str) -> tuple[int, int]:
    info = stub.GetQueue(pb.GetQueueRequest(name=name))
    return info.ready, info.unacked


class Requests:
    """A request stream the test feeds, and half-closes with ``close()``."""

    def __init__(self, first: Any) -> None:
        self._q: queue.Queue[Any] = queue.Queue()
        self._q.put(first)

    def __iter__(self) -> Iterator[Any]:
        while (item := self._q.get()) is not None:
            yield item

    def put(self, item: Any) -> None:
        self._q.put(item)

    def close(self) -> None:
        self._q.put(None)


def test_the_node_says_where_it_serves_grpc(node: NodeProc) -> None:
    assert f"gRPC on {grpc_addr(node)}, Raft on" in node.tail(50)
    with grpc.insecure_channel(grpc_addr(node)) as channel:
        stub = pb_grpc.DOQStub(channel)
        _queue(stub, "t")
        assert stub.Enqueue(pb.EnqueueRequest(queueName="t", content="x")).success


def test_a_cancelled_dequeue_stream_takes_nothing_more(node: NodeProc) -> None:
    """A DequeueStream waiting on an empty queue is cancelled by its client: its handler in
    the event loop ends, so a message enqueued afterwards stays ready for others."""
    with grpc.insecure_channel(grpc_addr(node)) as channel:
        stub = pb_grpc.DOQStub(channel)
        _queue(stub, "c")
        requests = Requests(pb.DequeueRequest(queueName="c", ack=False, credit=5))
        stream = stub.DequeueStream(iter(requests))
        time.sleep(0.5)                                  # the handler is waiting now
        stream.cancel()
        with pytest.raises(grpc.RpcError) as info:
            next(stream)
        assert info.value.code() == grpc.StatusCode.CANCELLED
        time.sleep(0.5)
        stub.Enqueue(pb.EnqueueRequest(queueName="c", content="for somebody else"))
        time.sleep(1.5)                                 # longer than the stream's fallback
        assert _counts(stub, "c") == (1, 0)


def test_a_half_closed_dequeue_stream_ends_promptly(node: NodeProc) -> None:
    """The client half-closes while the stream waits on an empty queue: the server ends the
    stream at once (OK, nothing delivered), not at the client's deadline."""
    with grpc.insecure_channel(grpc_addr(node)) as channel:
        stub = pb_grpc.DOQStub(channel)
        _queue(stub, "h")
        requests = Requests(pb.DequeueRequest(queueName="h", ack=False, credit=5))
        stream = stub.DequeueStream(iter(requests), timeout=30)
        time.sleep(0.5)
        started = time.monotonic()
        requests.close()
        assert list(stream) == []
        assert stream.code() == grpc.StatusCode.OK
        assert time.monotonic() - started < 3
        assert _counts(stub, "h") == (0, 0)


def test_64_client_threads_at_once_each_get_their_own_answer(tmp_path: Any) -> None:
    """A 3-node cluster, 64 client threads spread over the nodes at once: 48 make 20 unary
    Enqueue calls each, 16 send 50 messages each on an EnqueueStream. Every call is answered
    with its own message, every id is distinct, all are stored, and the replicas agree."""
    c = Cluster(str(tmp_path), size=3, flags=FLAGS).start()
    try:
        channels = [grpc.insecure_channel(grpc_addr(n)) for n in c.nodes]
        stubs = [pb_grpc.DOQStub(ch) for ch in channels]
        _queue(stubs[0], "m")
        got: list[tuple[str, int]] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def unary(worker: int) -> None:
            stub = stubs[worker % 3]
            try:
                for i in range(20):
                    r = stub.Enqueue(pb.EnqueueRequest(queueName="m", content=f"u{worker}-{i}"),
                                     timeout=60)
                    assert r.content == f"u{worker}-{i}"
                    with lock:
                        got.append((r.content, r.id))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def streamed(worker: int) -> None:
            stub = stubs[worker % 3]
            try:
                sent = (pb.EnqueueRequest(queueName="m", content=f"s{worker}-{i}")
                        for i in range(50))
                answers = [(r.content, r.id) for r in stub.EnqueueStream(sent, timeout=90)]
                assert [a for a, _ in answers] == [f"s{worker}-{i}" for i in range(50)]
                with lock:
                    got.extend(answers)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=unary, args=(w,)) for w in range(48)] + \
            [threading.Thread(target=streamed, args=(w,)) for w in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        assert not any(t.is_alive() for t in threads), "a client thread hung"
        assert not errors, errors[:3]
        assert len(got) == 48 * 20 + 16 * 50
        assert len({mid for _, mid in got}) == len(got)
        assert _counts(stubs[0], "m") == (len(got), 0)
        c.assert_replicas_identical(timeout=30)
        for ch in channels:
            ch.close()
    finally:
        c.stop()


def test_sigterm_ends_open_streams_and_loses_nothing_acknowledged(tmp_path: Any) -> None:
    """SIGTERM while an EnqueueStream and a waiting DequeueStream are open: both end
    promptly with UNAVAILABLE, the node exits cleanly, and every enqueue the stream
    acknowledged is there after a restart."""
    c = Cluster(str(tmp_path), size=1, flags=FLAGS).start()
    node = c.nodes[0]
    try:
        channel = grpc.insecure_channel(grpc_addr(node))
        stub = pb_grpc.DOQStub(channel)
        _queue(stub, "s")
        _queue(stub, "empty")
        producer = Requests(pb.EnqueueRequest(queueName="s", content="m0"))
        answers = stub.EnqueueStream(iter(producer), timeout=60)
        acknowledged = [next(answers).content]
        for i in range(1, 50):
            producer.put(pb.EnqueueRequest(queueName="s", content=f"m{i}"))
            acknowledged.append(next(answers).content)
        consumer = stub.DequeueStream(
            iter(Requests(pb.DequeueRequest(queueName="empty", ack=False, credit=1))),
            timeout=60)
        time.sleep(0.5)
        ended: dict[str, Any] = {}

        def wait_end(name: str, stream: Any) -> None:
            try:
                for _ in stream:
                    pass
                ended[name] = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                ended[name] = exc.code()

        waiters = [threading.Thread(target=wait_end, args=("enqueue", answers)),
                   threading.Thread(target=wait_end, args=("dequeue", consumer))]
        for t in waiters:
            t.start()
        started = time.monotonic()
        assert node.proc is not None
        node.proc.send_signal(signal.SIGTERM)
        for t in waiters:
            t.join(15)
        assert time.monotonic() - started < 10
        assert ended == {"enqueue": grpc.StatusCode.UNAVAILABLE,
                         "dequeue": grpc.StatusCode.UNAVAILABLE}, ended
        assert node.proc.wait(timeout=20) == 0
        channel.close()
        log = node.tail(200)
        assert "Traceback" not in log, log
        node.start()
        wait_until(node.ready, 30, describe=c.describe)
        with grpc.insecure_channel(grpc_addr(node)) as channel2:
            stub2 = pb_grpc.DOQStub(channel2)
            assert _counts(stub2, "s") == (50, 0)
            taken = []
            while True:
                try:
                    taken.append(stub2.Dequeue(pb.DequeueRequest(queueName="s", ack=True)).content)
                except grpc.RpcError:
                    break
            assert sorted(taken) == sorted(acknowledged)
    finally:
        c.stop()


def test_a_stream_handler_takes_every_waiting_request_at_once() -> None:
    """The inbox between a stream's reader and its handler: a take returns what waits (up to
    its limit) and tells the connection the bytes taken, in one call; a blocking take waits
    for the first request only; the end (or a malformed request) ends every later take."""
    import gevent

    from doq_lib.grpc.requests import MalformedRequest
    from doq_lib.grpc.streams import END, Inbox

    taken: list[int] = []
    inbox = Inbox(taken.append)
    assert inbox.take(5, block=False) == [] and inbox.take(5, timeout=0.01) == []
    for i in range(4):
        inbox.push(i, 10)
    assert inbox.take(3) == [0, 1, 2] and taken == [30]
    assert inbox.take(9) == [3] and taken == [30, 10]
    gevent.spawn_later(0.05, inbox.push, 4, 10)
    started = time.monotonic()
    assert inbox.take(9) == [4]                       # woken by the push
    assert time.monotonic() - started < 1
    inbox.activity.clear()
    inbox.push(END)
    assert inbox.activity.is_set()                    # the end wakes a waiting consumer
    assert inbox.take(9) == [] and inbox.ended and inbox.take(9, timeout=5) == []

    bad = Inbox(taken.append)
    bad.push(5, 10)
    bad.push(MalformedRequest("queue.EnqueueRequest"), 7)
    bad.push(6, 10)
    assert list(bad) == [5] and bad.ended                 # the requests end at the bad one
    assert bad.malformed is not None and "EnqueueRequest" in bad.malformed.message
    assert taken[-2:] == [10, 7]                          # one take each, as iterated
    assert list(Inbox.of([1, 2, 3])) == [1, 2, 3]


def test_a_flood_of_enqueue_streams_is_answered_in_order_and_in_full() -> None:
    """16 EnqueueStreams written as fast as flow control allows for 5 s
    (scripts/bench/grpc_flood.py; the 64-stream, 30 s run and the memory figures are in
    docs/BENCHMARKS.md): every message answered, each stream in order, no stream failed."""
    import json
    import os
    import subprocess
    import sys

    from tests.harness import REPO

    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "bench", "grpc_flood.py"),
         "--streams", "16", "--seconds", "5"],
        capture_output=True, text=True, timeout=240, cwd=REPO)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sent"] > 1000, result
    assert (result["missing"], result["out_of_order"], result["errors"],
            result["unfinished_streams"]) == (0, 0, [], 0), result
    assert out.returncode == 0


def test_a_malformed_request_is_refused_with_invalid_argument(node: NodeProc) -> None:
    """Bytes that are not the method's protobuf message: INVALID_ARGUMENT naming the
    message type, unary and streamed (what came before it on the stream is answered), no
    traceback in the log, nothing stored, the node keeps serving."""
    with grpc.insecure_channel(grpc_addr(node)) as channel:
        stub = pb_grpc.DOQStub(channel)
        _queue(stub, "bad")
        raw = channel.unary_unary("/queue.DOQ/Enqueue")
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x0a\xff\xff\xff\x0f", timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "queue.EnqueueRequest" in info.value.details()
        assert dict(info.value.trailing_metadata())["doq-error-code"] == "invalid_argument"
        good = pb.EnqueueRequest(queueName="bad", content="first").SerializeToString()
        stream = channel.stream_stream("/queue.DOQ/EnqueueStream")(
            iter([good, b"\xff\xff\xff"]), timeout=10)
        answers = []
        with pytest.raises(grpc.RpcError) as info:
            for answer in stream:
                answers.append(pb.EnqueueResponse.FromString(answer).content)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert answers == ["first"]
        assert _counts(stub, "bad") == (1, 0)
    assert "Traceback" not in node.tail(200)
