"""Bad input over gRPC is refused at the edge: names, groups and metadata held to
doq_lib/rules.py as over HTTP, requests past the size bound, and frames that are not the
message they claim to be. Each refusal names the problem and changes nothing."""
from __future__ import annotations

import queue as queue_module
import threading
import time
from typing import Any

import grpc
import pytest

from doq_lib import rules
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.grpc.calls import SC, enqueue, fails, new_queue


def ready_unacked(stub: pb_grpc.DOQStub, q: str) -> tuple[int, int]:
    info = stub.GetQueue(pb.GetQueueRequest(name=q))
    return info.ready, info.unacked


@pytest.mark.parametrize(("name", "text"), [
    (".", "name must not be '.' or '..'"),
    ("..", "name must not be '.' or '..'"),
    ("   ", "name must not be only spaces"),
    ("a\x00b", "name must not contain control characters"),
    ("line\r\nbreak", "name must not contain control characters"),
    ("tab\there", "name must not contain control characters"),
    ("c1\x85", "name must not contain control characters"),
], ids=["dot", "dotdot", "blank", "nul", "crlf", "tab", "c1-control"])
def test_create_queue_refuses_names_that_are_wrong_for_a_queue(
        stub: pb_grpc.DOQStub, name: str, text: str) -> None:
    before = {q.name for q in stub.GetQueues(pb.GetQueuesRequest()).queues}
    fails(lambda: stub.CreateQueue(pb.CreateQueueRequest(
        name=name, type="delayed", settings=pb.QueueSettings())), SC.INVALID_ARGUMENT, text)
    assert {q.name for q in stub.GetQueues(pb.GetQueuesRequest()).queues} == before


BAD_MESSAGES: list[tuple[str, dict[str, Any], str]] = [
    ("group-dotdot", {"group": ".."}, "group must not be '.' or '..'"),
    ("group-dot", {"group": "."}, "group must not be '.' or '..'"),
    ("group-nul", {"group": "a\x00"}, "group must not contain control characters"),
    ("group-newline", {"group": "a\nb"}, "group must not contain control characters"),
    ("group-blank", {"group": "  "}, "group must not be only spaces"),
    ("group-long", {"group": "g" * (rules.MAX_GROUP + 1)},
     f"group is longer than {rules.MAX_GROUP} bytes (UTF-8)"),
    ("group-deep", {"group": ".".join(["l"] * (rules.MAX_GROUP_DEPTH + 1))},
     f"group has more than {rules.MAX_GROUP_DEPTH} dot-separated labels"),
    ("group-empty-label", {"group": "a..b"}, "group must not have empty labels"),
    ("metadata-count", {"metadata": {f"k{i}": "v" for i in range(rules.MAX_METADATA + 1)}},
     f"metadata has more than {rules.MAX_METADATA} keys"),
    ("metadata-empty-key", {"metadata": {"": "v"}}, "metadata keys must not be empty"),
    ("metadata-key-control", {"metadata": {"a\x01": "v"}},
     "metadata key 'a\\x01' must not contain control characters"),
    ("metadata-key-long", {"metadata": {"k" * (rules.MAX_METADATA_KEY + 1): "v"}},
     f"is longer than {rules.MAX_METADATA_KEY} characters"),
    ("metadata-value-long", {"metadata": {"k": "v" * (rules.MAX_METADATA_VALUE + 1)}},
     f"metadata['k'] is longer than {rules.MAX_METADATA_VALUE} characters"),
]
BAD_IDS = [c[0] for c in BAD_MESSAGES]


@pytest.mark.parametrize(("case", "fields", "text"), BAD_MESSAGES, ids=BAD_IDS)
def test_enqueue_refuses_bad_groups_and_metadata(stub: pb_grpc.DOQStub, case: str,
                                                  fields: dict[str, Any], text: str) -> None:
    q = new_queue(stub, "fair")
    enqueue(stub, q, "kept")
    fails(lambda: enqueue(stub, q, "refused", **fields), SC.INVALID_ARGUMENT, text)
    assert ready_unacked(stub, q) == (1, 0)


@pytest.mark.parametrize(("case", "fields", "text"), BAD_MESSAGES[:7:3], ids=BAD_IDS[:7:3])
def test_enqueue_batch_names_the_bad_item_and_stores_none(
        stub: pb_grpc.DOQStub, case: str, fields: dict[str, Any], text: str) -> None:
    q = new_queue(stub, "fair")
    items = [pb.EnqueueRequest(queueName=q, content="ok", priority=10),
             pb.EnqueueRequest(queueName=q, content="bad", priority=10, **fields)]
    fails(lambda: stub.EnqueueBatch(pb.EnqueueBatchRequest(messages=items)),
          SC.INVALID_ARGUMENT, "messages[1]." + text)
    assert ready_unacked(stub, q) == (0, 0)


def test_enqueue_stream_refuses_a_bad_item_after_storing_the_ones_before(
        stub: pb_grpc.DOQStub) -> None:
    q = new_queue(stub, "fair")
    requests = [pb.EnqueueRequest(queueName=q, content="first", priority=10),
                pb.EnqueueRequest(queueName=q, content="bad", priority=10, group="..")]
    answers = stub.EnqueueStream(iter(requests))
    assert next(answers).content == "first"
    fails(lambda: next(answers), SC.INVALID_ARGUMENT, "group must not be '.' or '..'")
    assert ready_unacked(stub, q) == (1, 0)


def test_nack_refuses_bad_metadata_and_leaves_the_message_unacked(
        stub: pb_grpc.DOQStub) -> None:
    q = new_queue(stub)
    mid = enqueue(stub, q, "x").id
    assert stub.Dequeue(pb.DequeueRequest(queueName=q, ack=False)).id == mid
    fails(lambda: stub.Nack(pb.NackRequest(queueName=q, id=mid, priority=1,
                                           metadata={"": "v"})),
          SC.INVALID_ARGUMENT, "metadata keys must not be empty")
    assert ready_unacked(stub, q) == (0, 1)
    assert stub.Get(pb.GetRequest(queueName=q, id=mid)).metadata == {}


def test_good_groups_and_metadata_at_the_limits_are_stored(stub: pb_grpc.DOQStub) -> None:
    q = new_queue(stub, "fair")
    metadata = {f"k{i:02}": "v" for i in range(rules.MAX_METADATA - 1)}
    metadata["k" * rules.MAX_METADATA_KEY] = "v" * rules.MAX_METADATA_VALUE
    group = "g" * (rules.MAX_GROUP - 4) + ".a.b"
    out = enqueue(stub, q, "edge", group=group, metadata=metadata)
    got = stub.Get(pb.GetRequest(queueName=q, id=out.id))
    assert (got.group, dict(got.metadata)) == (group, metadata)


def test_a_request_past_the_size_bound_is_refused(stub: pb_grpc.DOQStub) -> None:
    """The bound of an HTTP body holds for a gRPC message too (doq_lib.rules.MAX_REQUEST)."""
    q = new_queue(stub)
    fails(lambda: enqueue(stub, q, "x" * rules.MAX_REQUEST), SC.RESOURCE_EXHAUSTED)
    assert ready_unacked(stub, q) == (0, 0)
    assert enqueue(stub, q, "x" * (rules.MAX_REQUEST - 1024)).id


@pytest.mark.parametrize(("method", "frame"), [
    ("Enqueue", b"\x0a\x03\xed\xbf\xbf"),            # queueName: a UTF-8-encoded surrogate
    ("Enqueue", b"\x0a\x02\xff\xfe"),                # queueName: not UTF-8 at all
    ("CreateQueue", b"\x0a\x10abc"),                 # a length past the end of the frame
    ("GetQueue", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"),   # a varint that never ends
], ids=["surrogate", "not-utf8", "truncated", "endless-varint"])
def test_a_frame_that_does_not_parse_is_invalid_argument(channel: grpc.Channel, method: str,
                                                          frame: bytes) -> None:
    call = channel.unary_unary(f"/queue.DOQ/{method}", request_serializer=None,
                               response_deserializer=None)
    fails(lambda: call(frame, timeout=10), SC.INVALID_ARGUMENT, "malformed request")


def test_a_stream_answers_what_came_before_a_frame_that_does_not_parse(
        stub: pb_grpc.DOQStub, channel: grpc.Channel) -> None:
    q = new_queue(stub)
    good = pb.EnqueueRequest(queueName=q, content="before", priority=10).SerializeToString()
    call = channel.stream_stream("/queue.DOQ/EnqueueStream", request_serializer=None,
                                 response_deserializer=pb.EnqueueResponse.FromString)
    answers = call(iter([good, b"\x0a\x02\xff\xfe", good]), timeout=10)
    assert next(answers).content == "before"
    fails(lambda: next(answers), SC.INVALID_ARGUMENT, "malformed request")
    assert ready_unacked(stub, q) == (1, 0)


@pytest.mark.parametrize("queue", ["empty", "unknown"])
def test_a_dequeue_stream_ends_promptly_when_the_client_half_closes(
        stub: pb_grpc.DOQStub, queue: str) -> None:
    """Waiting on an empty (or unknown) queue, the stream ends as soon as the client says it
    will send no more, not at the client's deadline."""
    name = new_queue(stub) if queue == "empty" else "never-created-queue"
    requests: queue_module.Queue[Any] = queue_module.Queue()
    requests.put(pb.DequeueRequest(queueName=name, ack=True, credit=10))

    def outgoing() -> Any:
        while (item := requests.get()) is not None:
            yield item
    stream = stub.DequeueStream(outgoing(), timeout=30)
    time.sleep(0.5)                       # the server is waiting for a message
    started = time.monotonic()
    requests.put(None)                    # half-close
    assert list(stream) == []
    assert time.monotonic() - started < 3


def test_a_cancelled_dequeue_stream_takes_nothing_after_it_was_cancelled(
        stub: pb_grpc.DOQStub) -> None:
    """With ack on dequeue, a message handed to a stream nobody reads would be lost: once
    the client cancels, a later message stays in the queue."""
    name = new_queue(stub)
    done = threading.Event()

    def outgoing() -> Any:
        yield pb.DequeueRequest(queueName=name, ack=True, credit=5)
        done.wait(30)                     # never half-closes by itself
    stream = stub.DequeueStream(outgoing(), timeout=30)
    try:
        time.sleep(0.5)
        stream.cancel()
        time.sleep(0.5)
        enqueue(stub, name, "after")
        time.sleep(1.0)
    finally:
        done.set()
    assert ready_unacked(stub, name) == (1, 0)
    assert stub.Dequeue(pb.DequeueRequest(queueName=name, ack=True)).content == "after"
