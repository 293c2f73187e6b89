"""The gRPC API (SPEC §4) against real nodes: a single node whose gRPC port is chosen by the OS
(``grpc.address`` port 0), and a follower of a 3-node cluster (writes forwarded to the leader).

Every RPC has a success test and a test per error, with the status code and the message.
"""
from __future__ import annotations

import queue
import statistics
import threading
import time
from typing import Any, Iterator

import grpc
import pytest

from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.grpc.calls import SC, Strategy, enqueue, fails, names, new_queue
from tests.harness import wait_until


# -- GenerateIDs -----------------------------------------------------------------------------------
def test_generate_ids(stub: pb_grpc.DOQStub) -> None:
    r = stub.GenerateIDs(pb.GenerateIDsRequest(number=5))
    assert r.success and len(r.ids) == 5
    assert list(r.ids) == sorted(set(r.ids))


@pytest.mark.parametrize("number", [0, -1, 1001])
def test_generate_ids_out_of_range(stub: pb_grpc.DOQStub, number: int) -> None:
    fails(lambda: stub.GenerateIDs(pb.GenerateIDsRequest(number=number)),
          SC.INVALID_ARGUMENT, "number must be between 1 and 1000")


# -- queues ----------------------------------------------------------------------------------------
def test_create_and_get_queue(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub, "delayed")
    info = stub.GetQueue(pb.GetQueueRequest(name=name))
    assert (info.name, info.type) == (name, "delayed")
    assert info.settings.strategy == Strategy.STRATEGY_UNSPECIFIED
    assert info.settings.ack_timeout == 1800                     # the configured default
    assert (info.ready, info.unacked, info.total) == (0, 0, 0)
    again = stub.CreateQueue(pb.CreateQueueRequest(       # a duplicate succeeds, changes nothing
        name=name, type="fair", settings=pb.QueueSettings(strategy=Strategy.WEIGHTED)))
    assert again.success and again.existed                 # ... and says so, with what is stored
    assert (again.type, again.settings.strategy, again.settings.ack_timeout) == (
        "delayed", Strategy.STRATEGY_UNSPECIFIED, 1800)
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).type == "delayed"
    fresh = stub.CreateQueue(pb.CreateQueueRequest(name=name + "-new", type="delayed",
                                                   settings=pb.QueueSettings()))
    assert fresh.success and not fresh.existed and not fresh.HasField("settings")
    stub.DeleteQueue(pb.DeleteQueueRequest(name=name + "-new"))


def test_create_fair_queue_defaults_to_round_robin_and_type_is_case_insensitive(
        stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub, "FAIR", max_unacked=3, ack_timeout=10)
    info = stub.GetQueue(pb.GetQueueRequest(name=name))
    assert info.type == "fair"
    assert info.settings.strategy == Strategy.ROUND_ROBIN
    assert (info.settings.max_unacked, info.settings.ack_timeout) == (3, 10)


@pytest.mark.parametrize("request_, texts", [
    (pb.CreateQueueRequest(name="x", type="delayed"), ["invalid settings provided"]),
    (pb.CreateQueueRequest(name="x", type="stack", settings=pb.QueueSettings()), ["type"]),
    (pb.CreateQueueRequest(name="", type="delayed", settings=pb.QueueSettings()),
     ["name is required"]),
    (pb.CreateQueueRequest(name="a/b", type="delayed", settings=pb.QueueSettings()), ["'/'"]),
    (pb.CreateQueueRequest(name="x" * 1025, type="delayed", settings=pb.QueueSettings()),
     ["longer than 1024"]),
    (pb.CreateQueueRequest(name="x", type="delayed", settings=pb.QueueSettings(ack_timeout=9)),
     ["ack_timeout"]),
    (pb.CreateQueueRequest(name="x", type="fair", settings=pb.QueueSettings(strategy=7)),
     ["unknown strategy 7"]),
    (pb.CreateQueueRequest(name="x", type="delayed",
                           settings=pb.QueueSettings(strategy=Strategy.WEIGHTED)),
     ["invalid strategy"]),
    (pb.CreateQueueRequest(name="x", type="delayed", settings=pb.QueueSettings(max_unacked=2)),
     ["invalid max unacked"]),
])
def test_create_queue_rejects_bad_requests(stub: pb_grpc.DOQStub, request_: Any,
                                           texts: list[str]) -> None:
    fails(lambda: stub.CreateQueue(request_), SC.INVALID_ARGUMENT, "failed to create a queue",
          *texts)
    names = [q.name for q in stub.GetQueues(pb.GetQueuesRequest()).queues]
    assert "x" not in names


def test_update_queue(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub, "fair", max_unacked=1)
    assert stub.UpdateQueue(pb.UpdateQueueRequest(
        name=name, settings=pb.QueueSettings(max_unacked=4, ack_timeout=30))).success
    info = stub.GetQueue(pb.GetQueueRequest(name=name))
    assert (info.settings.strategy, info.settings.max_unacked, info.settings.ack_timeout) == \
        (Strategy.ROUND_ROBIN, 4, 30)


def test_update_queue_errors(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub, "fair")
    fails(lambda: stub.UpdateQueue(pb.UpdateQueueRequest(name=name)), SC.INVALID_ARGUMENT,
          "queue settings are required")
    fails(lambda: stub.UpdateQueue(pb.UpdateQueueRequest(
        name="nope", settings=pb.QueueSettings())), SC.NOT_FOUND, "failed to update a queue")
    fails(lambda: stub.UpdateQueue(pb.UpdateQueueRequest(
        name=name, settings=pb.QueueSettings(strategy=Strategy.WEIGHTED))),
        SC.INVALID_ARGUMENT, "invalid queue settings")
    fails(lambda: stub.UpdateQueue(pb.UpdateQueueRequest(
        name=name, settings=pb.QueueSettings(ack_timeout=3))), SC.INVALID_ARGUMENT, "ack_timeout")
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).settings.ack_timeout == 1800


def test_delete_queue(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    enqueue(stub, name, "gone with the queue")
    assert stub.DeleteQueue(pb.DeleteQueueRequest(name=name)).success
    fails(lambda: stub.GetQueue(pb.GetQueueRequest(name=name)), SC.NOT_FOUND,
          "failed to get a queue")
    fails(lambda: stub.DeleteQueue(pb.DeleteQueueRequest(name=name)), SC.NOT_FOUND,
          "failed to delete a queue")
    stub.CreateQueue(pb.CreateQueueRequest(name=name, type="delayed",
                                           settings=pb.QueueSettings()))
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).total == 0     # starts empty


def test_get_queues_is_sorted_and_ignores_the_type_filter(stub: pb_grpc.DOQStub) -> None:
    new_queue(stub, "fair")
    new_queue(stub, "delayed")
    names = [q.name for q in stub.GetQueues(pb.GetQueuesRequest(type="fair")).queues]
    assert names == sorted(names)
    assert any(n.endswith("-delayed") for n in names) and any(n.endswith("-fair") for n in names)


def test_get_queue_counts_and_rates(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    for i in range(3):
        enqueue(stub, name, f"m{i}")
    stub.Dequeue(pb.DequeueRequest(queueName=name))
    info = stub.GetQueue(pb.GetQueueRequest(name=name))
    assert (info.ready, info.unacked, info.total) == (2, 1, 3)
    wait_until(lambda: stub.GetQueue(pb.GetQueueRequest(name=name)).stats.enqueueRPS > 0, 5)


# -- enqueue / dequeue -----------------------------------------------------------------------------
def test_enqueue_returns_the_stored_message(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub, "fair")
    r = enqueue(stub, name, "hello", 5, group="g1", metadata={"k": "v"})
    assert r.success and r.id > 0 and r.queueName == ""
    assert (r.group, r.priority, r.content, dict(r.metadata)) == ("g1", 5, "hello", {"k": "v"})
    got = stub.Get(pb.GetRequest(queueName=name, id=r.id))
    assert (got.id, got.group, got.content, dict(got.metadata)) == (r.id, "g1", "hello",
                                                                     {"k": "v"})


def test_enqueue_with_an_existing_id_makes_no_second_copy(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    assert enqueue(stub, name, "one", id=4242).id == 4242
    assert enqueue(stub, name, "two", id=4242).id == 4242
    info = stub.GetQueue(pb.GetQueueRequest(name=name))
    assert info.total == 1
    assert stub.Get(pb.GetRequest(queueName=name, id=4242)).content == "two"


def test_enqueue_errors(stub: pb_grpc.DOQStub) -> None:
    fails(lambda: enqueue(stub, "missing", "x"), SC.NOT_FOUND, "failed to enqueue a message",
          "missing")
    fails(lambda: enqueue(stub, "", "x"), SC.INVALID_ARGUMENT, "queueName is required")
    # one rule on both transports: the original took negative priorities over
    # gRPC only, and HTTP then served what it refuses on input
    fails(lambda: enqueue(stub, new_queue(stub), "x", -5), SC.INVALID_ARGUMENT,
          "failed to enqueue a message", "priority must be 0 or more")


def test_dequeue_with_and_without_ack(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    first = enqueue(stub, name, "first", 1, metadata={"a": "b"})
    second = enqueue(stub, name, "second", 2)
    got = stub.Dequeue(pb.DequeueRequest(queueName=name, ack=True))
    assert (got.id, got.content, dict(got.metadata)) == (first.id, "first", {"a": "b"})
    fails(lambda: stub.Get(pb.GetRequest(queueName=name, id=first.id)), SC.NOT_FOUND)
    got = stub.Dequeue(pb.DequeueRequest(queueName=name, ack=False))
    assert got.id == second.id
    assert stub.Get(pb.GetRequest(queueName=name, id=second.id)).content == "second"
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).unacked == 1


def test_dequeue_errors(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    fails(lambda: stub.Dequeue(pb.DequeueRequest(queueName=name)), SC.NOT_FOUND,
          "failed to dequeue a message", f"Queue is empty: {name}")
    fails(lambda: stub.Dequeue(pb.DequeueRequest(queueName="missing")), SC.NOT_FOUND,
          "failed to dequeue a message")
    err = fails(lambda: stub.Dequeue(pb.DequeueRequest(queueName="")), SC.INVALID_ARGUMENT)
    assert ("doq-error-code", "invalid_argument") in tuple(err.trailing_metadata())


def test_delayed_gating_over_grpc(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    enqueue(stub, name, "later", int(time.time()) + 3600)
    fails(lambda: stub.Dequeue(pb.DequeueRequest(queueName=name)), SC.NOT_FOUND, "empty")


# -- get / delete / ack / nack / touch / priority --------------------------------------------------
def test_get_and_delete(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    m = enqueue(stub, name, "doomed")
    assert stub.Delete(pb.DeleteRequest(queueName=name, id=m.id)).success
    fails(lambda: stub.Get(pb.GetRequest(queueName=name, id=m.id)), SC.NOT_FOUND,
          "failed to get a message")
    fails(lambda: stub.Delete(pb.DeleteRequest(queueName=name, id=m.id)), SC.NOT_FOUND,
          "failed to delete a message")
    fails(lambda: stub.Get(pb.GetRequest(queueName="missing", id=1)), SC.NOT_FOUND)
    fails(lambda: stub.Get(pb.GetRequest(queueName=name, id=0)), SC.INVALID_ARGUMENT,
          "id is required")


def test_ack(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    m = enqueue(stub, name, "work")
    stub.Dequeue(pb.DequeueRequest(queueName=name))
    assert stub.Ack(pb.AckRequest(queueName=name, id=m.id)).success
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).total == 0
    err = fails(lambda: stub.Ack(pb.AckRequest(queueName=name, id=m.id)),
                SC.FAILED_PRECONDITION, "failed to ack a message", f"Message not found: {name}")
    assert ("doq-error-code", "message_not_unacked") in tuple(err.trailing_metadata())
    fails(lambda: stub.Ack(pb.AckRequest(queueName="missing", id=m.id)), SC.NOT_FOUND)


def test_nack_returns_the_message_with_new_priority_and_metadata(
        stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    m = enqueue(stub, name, "retry me", 5, metadata={"try": "1"})
    stub.Dequeue(pb.DequeueRequest(queueName=name))
    assert stub.Nack(pb.NackRequest(queueName=name, id=m.id, priority=7,
                                    metadata={"try": "2"})).success
    again = stub.Dequeue(pb.DequeueRequest(queueName=name))
    assert (again.id, again.priority, dict(again.metadata)) == (m.id, 7, {"try": "2"})
    stub.Nack(pb.NackRequest(queueName=name, id=m.id))              # 0 and {} keep both
    again = stub.Dequeue(pb.DequeueRequest(queueName=name))
    assert (again.priority, dict(again.metadata)) == (7, {"try": "2"})
    stub.Ack(pb.AckRequest(queueName=name, id=m.id))
    fails(lambda: stub.Nack(pb.NackRequest(queueName=name, id=m.id)), SC.FAILED_PRECONDITION,
          "failed to nack a message")


def test_touch(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    m = enqueue(stub, name, "slow work")
    fails(lambda: stub.Touch(pb.TouchRequest(queueName=name, id=m.id)), SC.FAILED_PRECONDITION,
          "failed to touch a message")
    stub.Dequeue(pb.DequeueRequest(queueName=name))
    assert stub.Touch(pb.TouchRequest(queueName=name, id=m.id)).success
    fails(lambda: stub.Touch(pb.TouchRequest(queueName="missing", id=m.id)), SC.NOT_FOUND)


def test_update_priority(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    a = enqueue(stub, name, "a", 10)
    b = enqueue(stub, name, "b", 20)
    assert stub.UpdatePriority(pb.UpdatePriorityRequest(queueName=name, id=b.id,
                                                        priority=1)).success
    assert stub.Get(pb.GetRequest(queueName=name, id=b.id)).priority == 1
    assert stub.Dequeue(pb.DequeueRequest(queueName=name, ack=True)).id == b.id
    assert stub.Dequeue(pb.DequeueRequest(queueName=name, ack=True)).id == a.id
    fails(lambda: stub.UpdatePriority(pb.UpdatePriorityRequest(queueName=name, id=a.id,
                                                               priority=3)),
          SC.NOT_FOUND, "failed to update priority of a message")


# -- batch extensions ------------------------------------------------------------------------------
def test_enqueue_batch_stores_all_in_order(stub: pb_grpc.DOQStub) -> None:
    q1, q2 = new_queue(stub), new_queue(stub, "fair")
    requests = [pb.EnqueueRequest(queueName=q1 if i % 2 else q2, content=f"m{i}", priority=i,
                                  group="g") for i in range(50)]
    r = stub.EnqueueBatch(pb.EnqueueBatchRequest(messages=requests))
    assert r.success and len(set(r.ids)) == 50
    for i in (0, 1, 49):                                     # ids come in request order
        got = stub.Get(pb.GetRequest(queueName=q1 if i % 2 else q2, id=r.ids[i]))
        assert (got.content, got.priority) == (f"m{i}", i)
    assert stub.GetQueue(pb.GetQueueRequest(name=q1)).total == 25
    assert stub.GetQueue(pb.GetQueueRequest(name=q2)).total == 25


def test_enqueue_batch_is_all_or_nothing(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    requests = [pb.EnqueueRequest(queueName=name, content="kept?"),
                pb.EnqueueRequest(queueName="missing", content="x")]
    fails(lambda: stub.EnqueueBatch(pb.EnqueueBatchRequest(messages=requests)), SC.NOT_FOUND,
          "missing")
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).total == 0
    fails(lambda: stub.EnqueueBatch(pb.EnqueueBatchRequest()), SC.INVALID_ARGUMENT, "empty")
    bad = [pb.EnqueueRequest(queueName=name, content="a"), pb.EnqueueRequest(content="b")]
    fails(lambda: stub.EnqueueBatch(pb.EnqueueBatchRequest(messages=bad)), SC.INVALID_ARGUMENT)
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).total == 0


def test_enqueue_batch_stream_answers_each_batch_and_stops_at_a_failure(
        stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)

    def batch(queue: str, *contents: str) -> pb.EnqueueBatchRequest:
        return pb.EnqueueBatchRequest(messages=[pb.EnqueueRequest(queueName=queue, content=c)
                                                for c in contents])

    ok = list(stub.EnqueueBatchStream(iter([batch(name, "a", "b"), batch(name, "c")])))
    assert [len(r.ids) for r in ok] == [2, 1]
    assert stub.Get(pb.GetRequest(queueName=name, id=ok[1].ids[0])).content == "c"
    mixed = batch(name, "e")
    mixed.messages.append(pb.EnqueueRequest(queueName="missing", content="f"))
    stream = stub.EnqueueBatchStream(iter([batch(name, "d"), mixed, batch(name, "g")]))
    got = []
    with pytest.raises(grpc.RpcError) as info:
        for r in stream:
            got.append(len(r.ids))
    assert got == [1]                                       # "d"; "e" went with its batch
    assert info.value.code() == SC.NOT_FOUND and "missing" in info.value.details()
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).total == 4    # a b c d; never g


def test_ack_batch(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    ids = [enqueue(stub, name, f"m{i}").id for i in range(5)]
    for _ in range(4):
        stub.Dequeue(pb.DequeueRequest(queueName=name))
    r = stub.AckBatch(pb.AckBatchRequest(queueName=name, ids=ids + [123]))
    assert r.success and sorted(r.failed_ids) == sorted([ids[4], 123])
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).total == 1
    fails(lambda: stub.AckBatch(pb.AckBatchRequest(queueName="missing", ids=[1])),
          SC.NOT_FOUND)
    fails(lambda: stub.AckBatch(pb.AckBatchRequest(queueName=name, ids=[0])),
          SC.INVALID_ARGUMENT)


# -- EnqueueStream ---------------------------------------------------------------------------------
def test_enqueue_stream_answers_each_request_in_order(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    requests = [pb.EnqueueRequest(queueName=name, content=f"s{i}", priority=i)
                for i in range(300)]
    responses = list(stub.EnqueueStream(iter(requests)))          # pipelined: all sent at once
    assert [r.content for r in responses] == [f"s{i}" for i in range(300)]
    assert all(r.success for r in responses)
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).total == 300


def test_enqueue_stream_one_at_a_time(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    outbox: queue.Queue[Any] = queue.Queue()

    def requests() -> Iterator[pb.EnqueueRequest]:
        while (item := outbox.get()) is not None:
            yield item

    stream = stub.EnqueueStream(requests())
    for i in range(5):
        outbox.put(pb.EnqueueRequest(queueName=name, content=f"one{i}"))
        assert next(stream).content == f"one{i}"
    outbox.put(None)
    assert list(stream) == []
    assert stream.code() == SC.OK


def test_enqueue_stream_stops_at_the_first_failure(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    requests = [pb.EnqueueRequest(queueName=name, content="a"),
                pb.EnqueueRequest(queueName=name, content="b"),
                pb.EnqueueRequest(queueName="missing", content="c"),
                pb.EnqueueRequest(queueName=name, content="d")]
    stream = stub.EnqueueStream(iter(requests))
    got = []
    with pytest.raises(grpc.RpcError) as info:
        for r in stream:
            got.append(r.content)
    assert got == ["a", "b"]
    assert info.value.code() == SC.NOT_FOUND
    assert "failed to enqueue a message" in info.value.details()
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).total == 2     # "d" was not processed


# -- DequeueStream ---------------------------------------------------------------------------------
class Subscription:
    """A DequeueStream driven from the test: grant credit, receive with a timeout."""

    def __init__(self, stub: pb_grpc.DOQStub, first: pb.DequeueRequest) -> None:
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.outbox.put(first)
        self.stream = stub.DequeueStream(self._requests())
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _requests(self) -> Iterator[pb.DequeueRequest]:
        while (item := self.outbox.get()) is not None:
            yield item

    def _read(self) -> None:
        try:
            for response in self.stream:
                self.inbox.put((time.monotonic(), response))
        except grpc.RpcError as exc:
            self.inbox.put((time.monotonic(), exc))

    def grant(self, credit: int = 0) -> None:
        self.outbox.put(pb.DequeueRequest(credit=credit))

    def receive(self, timeout: float = 5.0) -> tuple[float, Any]:
        return self.inbox.get(timeout=timeout)  # type: ignore[no-any-return]

    def nothing_for(self, seconds: float) -> bool:
        try:
            self.inbox.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.outbox.put(None)
        self.stream.cancel()
        self.reader.join(5)


def test_dequeue_stream_one_in_flight(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    for i in range(3):
        enqueue(stub, name, f"m{i}", i)
    sub = Subscription(stub, pb.DequeueRequest(queueName=name, ack=True))
    try:
        assert sub.receive()[1].content == "m0"
        assert sub.nothing_for(0.3)                    # no second message without a request
        sub.grant()
        assert sub.receive()[1].content == "m1"
        sub.outbox.put(pb.DequeueRequest(queueName="other", ack=False))   # content ignored
        assert sub.receive()[1].content == "m2"
    finally:
        sub.close()
    assert stub.GetQueue(pb.GetQueueRequest(name=name)).total == 0


def test_dequeue_stream_credit_grants_several_messages(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    stub.EnqueueBatch(pb.EnqueueBatchRequest(messages=[
        pb.EnqueueRequest(queueName=name, content=f"m{i}", priority=i) for i in range(10)]))
    sub = Subscription(stub, pb.DequeueRequest(queueName=name, ack=False, credit=4))
    try:
        got = [sub.receive()[1].content for _ in range(4)]
        assert got == ["m0", "m1", "m2", "m3"]
        assert sub.nothing_for(0.3)
        sub.grant(5)
        got = [sub.receive()[1].content for _ in range(5)]
        assert got == [f"m{i}" for i in range(4, 9)]
        assert sub.nothing_for(0.3)
        assert stub.GetQueue(pb.GetQueueRequest(name=name)).unacked == 9
    finally:
        sub.close()


def test_dequeue_stream_batches_messages_when_asked(stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    stub.EnqueueBatch(pb.EnqueueBatchRequest(messages=[
        pb.EnqueueRequest(queueName=name, content=f"m{i}", priority=i) for i in range(10)]))
    sub = Subscription(stub, pb.DequeueRequest(queueName=name, ack=True, credit=7, max_batch=4))
    try:
        got = []
        while len(got) < 7:
            response = sub.receive()[1]
            assert response.success and response.id == 0 and 1 <= len(response.messages) <= 4
            got += [m.content for m in response.messages]
        assert got == [f"m{i}" for i in range(7)]       # within the credit, in order
        assert sub.nothing_for(0.3)
        sub.grant(10)
        got = []
        while len(got) < 3:
            got += [m.content for m in sub.receive()[1].messages]
        assert got == ["m7", "m8", "m9"]
    finally:
        sub.close()


def test_dequeue_stream_wakes_up_on_enqueue(stub: pb_grpc.DOQStub) -> None:
    """Loose check of the wake-up latency (the benchmark measures it properly)."""
    name = new_queue(stub)
    sub = Subscription(stub, pb.DequeueRequest(queueName=name, ack=True))
    delays = []
    try:
        time.sleep(0.2)                        # subscribed and waiting on an empty queue
        for i in range(20):
            enqueue(stub, name, f"w{i}")
            acked = time.monotonic()
            arrived, response = sub.receive()
            assert response.content == f"w{i}"
            delays.append(arrived - acked)
            sub.grant()
            time.sleep(0.02)
    finally:
        sub.close()
    # Without a wake-up the stream would only retry every second.
    assert statistics.median(delays) < 0.25, delays
    assert max(delays) < 0.9, delays


def test_dequeue_stream_is_woken_by_an_ack_that_frees_a_fair_group(
        stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub, "fair", max_unacked=1)
    first = enqueue(stub, name, "a", group="g")
    enqueue(stub, name, "b", group="g")
    sub = Subscription(stub, pb.DequeueRequest(queueName=name, ack=False, credit=2))
    try:
        assert sub.receive()[1].id == first.id
        assert sub.nothing_for(0.3)                   # the group is at its max_unacked
        stub.Ack(pb.AckRequest(queueName=name, id=first.id))
        acked = time.monotonic()
        arrived, response = sub.receive()
        assert response.content == "b"
        assert arrived - acked < 0.9                  # woken, not the 1 s fallback
    finally:
        sub.close()


def test_dequeue_stream_waits_for_a_queue_that_does_not_exist_yet(
        stub: pb_grpc.DOQStub) -> None:
    name = f"later{next(names)}"
    sub = Subscription(stub, pb.DequeueRequest(queueName=name, ack=True))
    try:
        assert sub.nothing_for(0.3)
        stub.CreateQueue(pb.CreateQueueRequest(name=name, type="delayed",
                                               settings=pb.QueueSettings()))
        enqueue(stub, name, "finally")
        assert sub.receive(timeout=5)[1].content == "finally"
    finally:
        sub.close()


def test_dequeue_stream_rejects_an_empty_queue_name(stub: pb_grpc.DOQStub) -> None:
    sub = Subscription(stub, pb.DequeueRequest(queueName=""))
    try:
        _, result = sub.receive()
        assert isinstance(result, grpc.RpcError)
        assert result.code() == SC.INVALID_ARGUMENT
    finally:
        sub.close()


def test_dequeue_stream_ends_when_the_client_half_closes_without_credit(
        stub: pb_grpc.DOQStub) -> None:
    name = new_queue(stub)
    enqueue(stub, name, "only")
    stream = stub.DequeueStream(iter([pb.DequeueRequest(queueName=name, ack=True)]))
    assert [r.content for r in stream] == ["only"]
    assert stream.code() == SC.OK
