"""The gRPC servicer in process: DoqServicer over the service over the in-memory proposer, with
the handler context a node gives it (grpc.calls.HubContext) and a stream's requests in an
inbox (grpc.streams.Inbox). Every RPC of queue.DOQ,
answers and failures, without sockets or subprocesses (the wire itself: tests/grpc/test_api.py)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable

import grpc
import pytest

from doq_lib.grpc.api import DoqServicer, GrpcAuth
from doq_lib.grpc.calls import Aborted, HubContext
from doq_lib.grpc.streams import Inbox
from doq_lib.pb import doq_pb2 as pb
from tests.conftest import LocalNode

SC = grpc.StatusCode


class Rpc:
    """Calls the servicer's methods by name and notes which were called."""

    def __init__(self, servicer: DoqServicer) -> None:
        self._servicer = servicer
        self.called: set[str] = set()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._servicer, name)

        def call(request: Any) -> Any:
            self.called.add(name)
            context = HubContext(())
            try:
                if isinstance(request, Iterator):
                    return list(method(Inbox.of(request), context))
                return method(request, context)
            finally:
                context.end()
        return call


@pytest.fixture
def rpc(local: LocalNode) -> Rpc:
    return Rpc(DoqServicer(local.service, GrpcAuth(None)))


def refused(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(Aborted) as aborted:
        call()
    return aborted.value.code, aborted.value.details


def delayed(rpc: Rpc, name: str) -> None:
    rpc.CreateQueue(pb.CreateQueueRequest(name=name, type="delayed",
                                          settings=pb.QueueSettings(ack_timeout=60)))


def test_queues(rpc: Rpc) -> None:
    delayed(rpc, "d")
    rpc.CreateQueue(pb.CreateQueueRequest(name="f", type="fair", settings=pb.QueueSettings(
        strategy=pb.QueueSettings.WEIGHTED, max_unacked=2, ack_timeout=60)))
    assert rpc.UpdateQueue(pb.UpdateQueueRequest(name="f", settings=pb.QueueSettings(
        max_unacked=3, ack_timeout=90))).success
    info = rpc.GetQueue(pb.GetQueueRequest(name="f"))
    assert (info.settings.max_unacked, info.settings.ack_timeout) == (3, 90)
    assert [q.name for q in rpc.GetQueues(pb.GetQueuesRequest()).queues] == ["d", "f"]
    assert rpc.DeleteQueue(pb.DeleteQueueRequest(name="d")).success
    assert refused(lambda: rpc.GetQueue(pb.GetQueueRequest(name="d"))) == \
        (SC.NOT_FOUND, "failed to get a queue: queue not found")
    assert refused(lambda: rpc.CreateQueue(pb.CreateQueueRequest(
        name="x", type="delayed", settings=pb.QueueSettings(ack_timeout=5))))[0] == \
        SC.INVALID_ARGUMENT
    ids = rpc.GenerateIDs(pb.GenerateIDsRequest(number=3)).ids
    assert len(set(ids)) == 3


def test_messages(rpc: Rpc) -> None:
    delayed(rpc, "q")
    first = rpc.Enqueue(pb.EnqueueRequest(queueName="q", priority=5, content="a",
                                          metadata={"k": "v"}))
    assert first.success and first.content == "a"
    ids = rpc.EnqueueBatch(pb.EnqueueBatchRequest(messages=[
        pb.EnqueueRequest(queueName="q", priority=p, content=f"b{p}") for p in (6, 7)])).ids
    assert len(ids) == 2
    got = rpc.Get(pb.GetRequest(queueName="q", id=first.id))
    assert (got.content, dict(got.metadata)) == ("a", {"k": "v"})
    assert rpc.UpdatePriority(pb.UpdatePriorityRequest(queueName="q", id=ids[1],
                                                       priority=1)).success
    taken = rpc.Dequeue(pb.DequeueRequest(queueName="q", ack=False))
    assert taken.content == "b7"                               # priority 1 now comes first
    assert rpc.Touch(pb.TouchRequest(queueName="q", id=taken.id)).success
    assert rpc.Nack(pb.NackRequest(queueName="q", id=taken.id, priority=9)).success
    again = rpc.Dequeue(pb.DequeueRequest(queueName="q", ack=False))
    assert rpc.Ack(pb.AckRequest(queueName="q", id=again.id)).success
    assert rpc.Delete(pb.DeleteRequest(queueName="q", id=ids[0])).success
    assert refused(lambda: rpc.Ack(pb.AckRequest(queueName="q", id=again.id))) == \
        (SC.FAILED_PRECONDITION, "failed to ack a message: Message not found: q")
    assert refused(lambda: rpc.Enqueue(pb.EnqueueRequest(queueName="nope", content="x"))) == \
        (SC.NOT_FOUND, "failed to enqueue a message: Failed to get a queue: nope")
    held = rpc.Dequeue(pb.DequeueRequest(queueName="q", ack=False))
    done = rpc.AckBatch(pb.AckBatchRequest(queueName="q", ids=[held.id, 12345]))
    assert list(done.failed_ids) == [12345]


def test_streams(rpc: Rpc) -> None:
    delayed(rpc, "s")
    stored = rpc.EnqueueStream(iter([pb.EnqueueRequest(queueName="s", priority=i,
                                                       content=f"s{i}") for i in range(3)]))
    assert [a.content for a in stored] == ["s0", "s1", "s2"]
    batches = rpc.EnqueueBatchStream(iter([pb.EnqueueBatchRequest(messages=[
        pb.EnqueueRequest(queueName="s", priority=10 + i, content=f"t{i}")]) for i in range(2)]))
    assert [len(b.ids) for b in batches] == [1, 1]
    # credit 3, batches of 2: two responses, the client half-closes after its first request
    out = rpc.DequeueStream(iter([pb.DequeueRequest(queueName="s", ack=True, credit=3,
                                                    max_batch=2)]))
    assert [[m.content for m in r.messages] for r in out] == [["s0", "s1"], ["s2"]]
    code, details = refused(lambda: rpc.EnqueueStream(iter([
        pb.EnqueueRequest(queueName="s", content="ok"),
        pb.EnqueueRequest(queueName="missing", content="x")])))
    assert (code, details) == (SC.NOT_FOUND, "failed to enqueue a message: "
                                             "Failed to get a queue: missing")


def test_pages_and_batches_of_large_messages_stay_inside_the_message_limit(rpc: Rpc) -> None:
    """BrowseMessages over 4 MiB failed RESOURCE_EXHAUSTED (with a traceback);
    a page, and a batched DequeueStream response, end early instead."""
    delayed(rpc, "big")
    for i in range(9):
        rpc.Enqueue(pb.EnqueueRequest(queueName="big", priority=i, content=f"{i}" + "é" * 450_000))
    seen, after, pages = [], 0, 0
    while True:
        page = rpc.BrowseMessages(pb.BrowseRequest(queueName="big", limit=1000, after=after))
        assert page.ByteSize() < 4 << 20 and page.messages
        seen += [m.message.content[0] for m in page.messages]
        pages += 1
        if not page.next:
            break
        after = page.next
    assert seen == [str(i) for i in range(9)] and pages >= 3
    out = rpc.DequeueStream(iter([pb.DequeueRequest(queueName="big", ack=True, credit=9,
                                                    max_batch=9)]))
    assert all(r.ByteSize() < 4 << 20 for r in out) and len(out) >= 3
    assert [m.content[0] for r in out for m in r.messages] == [str(i) for i in range(9)]


def test_dead_letters(rpc: Rpc) -> None:
    """Delivery counts, last errors, max_deliveries and Reject over gRPC."""
    delayed(rpc, "dlq")
    rpc.CreateQueue(pb.CreateQueueRequest(name="work", type="fair", settings=pb.QueueSettings(
        ack_timeout=60, max_deliveries=2, dead_letter_queue="dlq")))
    info = rpc.GetQueue(pb.GetQueueRequest(name="work")).settings
    assert (info.max_deliveries, info.dead_letter_queue) == (2, "dlq")
    sent = rpc.Enqueue(pb.EnqueueRequest(queueName="work", group="g", priority=1,
                                         content="job", metadata={"k": "v"}))
    first = rpc.Dequeue(pb.DequeueRequest(queueName="work"))
    assert (first.id, first.deliveries, first.last_error) == (sent.id, 1, "")
    back = rpc.Nack(pb.NackRequest(queueName="work", id=sent.id, error="timeout"))
    assert back.success and not back.dead_lettered
    got = rpc.Get(pb.GetRequest(queueName="work", id=sent.id))
    assert (got.deliveries, got.last_error) == (1, "timeout")
    second = rpc.Dequeue(pb.DequeueRequest(queueName="work"))
    assert (second.deliveries, second.last_error) == (2, "timeout")
    assert rpc.Nack(pb.NackRequest(queueName="work", id=sent.id, error="again")).dead_lettered
    dead = rpc.Dequeue(pb.DequeueRequest(queueName="dlq", ack=True))
    assert dead.content == "job" and dead.priority == 0 and dead.deliveries == 1
    meta = dict(dead.metadata)
    assert meta.pop("x-dead-at").isdigit()
    assert meta == {"k": "v", "x-dead-reason": "max_deliveries", "x-dead-from": "work",
                    "x-deliveries": "2", "x-last-error": "again"}
    # Reject: dead-letter now
    other = rpc.Enqueue(pb.EnqueueRequest(queueName="work", group="g", priority=1, content="x"))
    rpc.Dequeue(pb.DequeueRequest(queueName="work"))
    assert rpc.Reject(pb.RejectRequest(queueName="work", id=other.id, error="bad")).success
    rejected = rpc.Dequeue(pb.DequeueRequest(queueName="dlq", ack=True))
    assert rejected.metadata["x-dead-reason"] == "rejected"
    assert refused(lambda: rpc.Reject(pb.RejectRequest(queueName="work", id=other.id))) == \
        (SC.FAILED_PRECONDITION, "failed to reject a message: Message not found: work")
    # Redrive: back to work, deliveries reset
    third = rpc.Enqueue(pb.EnqueueRequest(queueName="work", group="g", priority=1, content="y"))
    rpc.Dequeue(pb.DequeueRequest(queueName="work"))
    rpc.Reject(pb.RejectRequest(queueName="work", id=third.id))
    out = rpc.Redrive(pb.RedriveRequest(queueName="dlq", ids=[third.id, 99]))
    assert out.moved == 1 and [(f.id, f.code) for f in out.failed] == [
        (99, "message_not_found")]
    assert rpc.Get(pb.GetRequest(queueName="work", id=third.id)).deliveries == 0
    assert refused(lambda: rpc.Redrive(pb.RedriveRequest(queueName="dlq", ids=[1],
                                                         count=2)))[0] == SC.INVALID_ARGUMENT
    assert refused(lambda: rpc.Redrive(pb.RedriveRequest(queueName="dlq", to="ghost"))) == \
        (SC.INVALID_ARGUMENT, "failed to redrive messages: to: queue 'ghost' does not exist")
    # lifecycle settings: checked at the edge and by the state
    for settings, said in ((pb.QueueSettings(dead_letter_queue="a/b"), "dead_letter_queue"),
                           (pb.QueueSettings(dead_letter_queue="none"), "does not exist"),
                           (pb.QueueSettings(dead_letter_queue="c"), "its own")):
        code, details = refused(lambda s=settings: rpc.CreateQueue(pb.CreateQueueRequest(
            name="c", type="delayed", settings=s)))
        assert code == SC.INVALID_ARGUMENT and said in details, details
    code, details = refused(lambda: rpc.UpdateQueue(pb.UpdateQueueRequest(
        name="dlq", settings=pb.QueueSettings(dead_letter_queue="work"))))
    assert code == SC.INVALID_ARGUMENT and "cycle (dlq -> work -> dlq)" in details, details
    code, details = refused(lambda: rpc.Nack(pb.NackRequest(queueName="work", id=1,
                                                            error="e" * 5000)))
    assert code == SC.INVALID_ARGUMENT and "error" in details
    code, details = refused(lambda: rpc.DeleteQueue(pb.DeleteQueueRequest(name="dlq")))
    assert code == SC.FAILED_PRECONDITION and "dead-letter queue of 'work'" in details
    # max_messages: RESOURCE_EXHAUSTED, nothing stored
    rpc.CreateQueue(pb.CreateQueueRequest(name="cap", type="delayed", settings=pb.QueueSettings(
        max_messages=1)))
    assert rpc.GetQueue(pb.GetQueueRequest(name="cap")).settings.max_messages == 1
    rpc.Enqueue(pb.EnqueueRequest(queueName="cap", content="a"))
    assert refused(lambda: rpc.Enqueue(pb.EnqueueRequest(queueName="cap", content="b"))) == (
        SC.RESOURCE_EXHAUSTED, "failed to enqueue a message: queue is full: cap")
    code, details = refused(lambda: rpc.UpdateQueue(pb.UpdateQueueRequest(
        name="cap", settings=pb.QueueSettings(overflow="sideways"))))
    assert code == SC.INVALID_ARGUMENT and "settings.overflow" in details
    # the dedup window
    rpc.CreateQueue(pb.CreateQueueRequest(name="once", type="delayed", settings=pb.QueueSettings(
        dedup_window=600)))
    one = rpc.Enqueue(pb.EnqueueRequest(queueName="once", content="a", dedup_key="k1"))
    two = rpc.Enqueue(pb.EnqueueRequest(queueName="once", content="b", dedup_key="k1"))
    assert (one.duplicate, two.duplicate, two.id) == (False, True, one.id)
    assert rpc.GetQueue(pb.GetQueueRequest(name="once")).settings.dedup_window == 600
    code, details = refused(lambda: rpc.Enqueue(pb.EnqueueRequest(
        queueName="once", content="c", dedup_key="k" * 300)))
    assert code == SC.INVALID_ARGUMENT and "dedup_key" in details
    # a nack's delay, back-off settings
    rpc.UpdateQueue(pb.UpdateQueueRequest(name="once", settings=pb.QueueSettings(
        backoff_initial=5, backoff_max=60)))
    got = rpc.GetQueue(pb.GetQueueRequest(name="once")).settings
    assert (got.backoff_initial, got.backoff_max) == (5, 60)
    taken = rpc.Dequeue(pb.DequeueRequest(queueName="once"))
    assert rpc.Nack(pb.NackRequest(queueName="once", id=taken.id, delay=3600)).success
    assert refused(lambda: rpc.Dequeue(pb.DequeueRequest(queueName="once")))[0] == SC.NOT_FOUND
    code, details = refused(lambda: rpc.UpdateQueue(pb.UpdateQueueRequest(
        name="once", settings=pb.QueueSettings(backoff_max=1))))
    assert code == SC.INVALID_ARGUMENT and "backoff_max" in details
    # TTL
    rpc.UpdateQueue(pb.UpdateQueueRequest(name="once", settings=pb.QueueSettings(
        message_ttl=3600)))
    assert rpc.GetQueue(pb.GetQueueRequest(name="once")).settings.message_ttl == 3600
    timed = rpc.Enqueue(pb.EnqueueRequest(queueName="once", content="t", ttl=60))
    assert rpc.Get(pb.GetRequest(queueName="once", id=timed.id)).expires_at > 0
    code, details = refused(lambda: rpc.Enqueue(pb.EnqueueRequest(queueName="once",
                                                                  content="t", ttl=10**9)))
    assert code == SC.INVALID_ARGUMENT and "ttl" in details
    # an update that leaves the lifecycle fields unset keeps them
    rpc.UpdateQueue(pb.UpdateQueueRequest(name="work", settings=pb.QueueSettings(
        ack_timeout=90)))
    kept = rpc.GetQueue(pb.GetQueueRequest(name="work")).settings
    assert (kept.ack_timeout, kept.max_deliveries, kept.dead_letter_queue) == (90, 2, "dlq")


def test_controls(rpc: Rpc) -> None:
    """Operator controls over gRPC: purge, pause / resume of a queue and of groups, GetGroups."""
    delayed(rpc, "d")
    rpc.CreateQueue(pb.CreateQueueRequest(name="f", type="fair", settings=pb.QueueSettings(
        ack_timeout=60)))
    for group in ("a", "a.b", "b"):
        rpc.Enqueue(pb.EnqueueRequest(queueName="f", content=group, group=group, priority=1))
    assert rpc.PauseQueue(pb.QueueControlRequest(queueName="f")).changed
    assert not rpc.PauseQueue(pb.QueueControlRequest(queueName="f")).changed
    assert rpc.GetQueue(pb.GetQueueRequest(name="f")).paused
    code, details = refused(lambda: rpc.Dequeue(pb.DequeueRequest(queueName="f")))
    assert code == SC.NOT_FOUND and "Queue is paused: f" in details
    assert rpc.ResumeQueue(pb.QueueControlRequest(queueName="f")).changed
    assert rpc.PauseGroup(pb.GroupControlRequest(queueName="f", group="a")).changed
    assert rpc.GetQueue(pb.GetQueueRequest(name="f")).paused_groups == 1
    assert rpc.Dequeue(pb.DequeueRequest(queueName="f")).group == "b"
    assert refused(lambda: rpc.Dequeue(pb.DequeueRequest(queueName="f")))[0] == SC.NOT_FOUND
    groups = rpc.GetGroups(pb.GetGroupsRequest(queueName="f")).groups
    assert [(g.group, g.ready, g.unacked, g.paused, g.paused_by) for g in groups] == [
        ("a", 1, 0, True, "a"), ("a.b", 1, 0, True, "a"), ("b", 0, 1, False, "")]
    assert rpc.ResumeGroup(pb.GroupControlRequest(queueName="f", group="a")).changed
    for call, field in (
            (lambda: rpc.PauseGroup(pb.GroupControlRequest(queueName="f")), "group is required"),
            (lambda: rpc.PauseGroup(pb.GroupControlRequest(queueName="f", group="a\x00")),
             "control characters"),
            (lambda: rpc.PauseGroup(pb.GroupControlRequest(queueName="d", group="a")),
             "delayed queue"),
            (lambda: rpc.PurgeQueue(pb.PurgeQueueRequest(queueName="")), "queueName")):
        code, details = refused(call)
        assert code == SC.INVALID_ARGUMENT and field in details, details
    code, _ = refused(lambda: rpc.ResumeQueue(pb.QueueControlRequest(queueName="nope")))
    assert code == SC.NOT_FOUND
    code, _ = refused(lambda: rpc.GetGroups(pb.GetGroupsRequest(queueName="nope")))
    assert code == SC.NOT_FOUND
    rpc.UpdateQueue(pb.UpdateQueueRequest(name="f", settings=pb.QueueSettings(
        max_in_flight=4, group_rate=0.5, group_burst=2)))
    got = rpc.GetQueue(pb.GetQueueRequest(name="f")).settings
    assert (got.max_in_flight, got.group_rate, got.group_burst) == (4, 0.5, 2)
    code, details = refused(lambda: rpc.UpdateQueue(pb.UpdateQueueRequest(
        name="f", settings=pb.QueueSettings(group_rate=-2))))
    assert code == SC.INVALID_ARGUMENT and "group_rate" in details
    assert rpc.PurgeQueue(pb.PurgeQueueRequest(queueName="f")).purged == 2
    assert rpc.PurgeQueue(pb.PurgeQueueRequest(queueName="f", include_unacked=True)).purged == 1
    assert rpc.GetQueue(pb.GetQueueRequest(name="f")).total == 0


def test_browse_and_explain(rpc: Rpc) -> None:
    delayed(rpc, "b")
    ids = [rpc.Enqueue(pb.EnqueueRequest(queueName="b", content=f"m{p}", priority=p)).id
           for p in (3, 1, 2)]
    page = rpc.BrowseMessages(pb.BrowseRequest(queueName="b", state="ready", limit=2))
    assert [m.message.content for m in page.messages] == ["m1", "m2"] and page.next == ids[2]
    rest = rpc.BrowseMessages(pb.BrowseRequest(queueName="b", after=page.next))
    assert [(m.message.id, m.state) for m in rest.messages] == [(ids[0], "ready")]
    assert rest.next == 0
    taken = rpc.Dequeue(pb.DequeueRequest(queueName="b"))
    listed = rpc.BrowseMessages(pb.BrowseRequest(queueName="b", state="unacked")).messages
    assert [(m.message.id, m.state, m.deadline > 0) for m in listed] == [
        (taken.id, "unacked", True)]
    out = rpc.ExplainMessage(pb.ExplainRequest(queueName="b", id=ids[0]))
    assert (out.id, out.state, out.ahead, list(out.reasons)) == (ids[0], "ready", 1, [])
    rpc.PauseQueue(pb.QueueControlRequest(queueName="b"))
    out = rpc.ExplainMessage(pb.ExplainRequest(queueName="b", id=ids[0]))
    assert out.state == "blocked" and [r.code for r in out.reasons] == ["queue_paused"]
    for call, says in (
            (lambda: rpc.BrowseMessages(pb.BrowseRequest(queueName="b", state="x")), "state"),
            (lambda: rpc.BrowseMessages(pb.BrowseRequest(queueName="b", limit=5000)), "limit"),
            (lambda: rpc.BrowseMessages(pb.BrowseRequest(queueName="b", after=999)), "after"),
            (lambda: rpc.ExplainMessage(pb.ExplainRequest(queueName="b")), "id is required")):
        code, details = refused(call)
        assert code == SC.INVALID_ARGUMENT and says in details, details
    code, _ = refused(lambda: rpc.ExplainMessage(pb.ExplainRequest(queueName="b", id=999)))
    assert code == SC.NOT_FOUND
    assert rpc.GetQueue(pb.GetQueueRequest(name="b")).total == 3
    # a named consumer, its lease fenced by its token
    rpc.ResumeQueue(pb.QueueControlRequest(queueName="b"))
    mine = rpc.Dequeue(pb.DequeueRequest(queueName="b", consumer="local-2"))
    known = rpc.GetConsumers(pb.GetConsumersRequest(queueName="b")).consumers
    assert [(c.name, c.held, list(c.messages)) for c in known] == [("local-2", 1, [mine.id])]
    rpc.Ack(pb.AckRequest(queueName="b", id=mine.id, delivery=mine.delivery))
    code, details = refused(lambda: rpc.Ack(pb.AckRequest(queueName="b", id=mine.id,
                                                          delivery=mine.delivery)))
    assert code == SC.FAILED_PRECONDITION and "Message not found" in details   # gone


def test_explain_of_a_message_delayed_past_the_wire(rpc: Rpc) -> None:
    """a delayed message with priority >= ~1.9e16 (its unix ms past uint64) made
    ExplainMessage fail INTERNAL; the time it names is capped at 2^63-1 (never)."""
    delayed(rpc, "far")
    for priority in (2 ** 63 - 1, 19_000_000_000_000_000, 10 ** 12):
        mid = rpc.Enqueue(pb.EnqueueRequest(queueName="far", content="x",
                                            priority=priority)).id
        out = rpc.ExplainMessage(pb.ExplainRequest(queueName="far", id=mid))
        assert out.state == "blocked" and out.reasons[0].code == "delayed_until"
        assert out.reasons[0].until == min(priority * 1000, 2 ** 63 - 1)


def test_the_slowest_and_fastest_group_rates_are_taken(rpc: Rpc) -> None:
    from doq_lib import rules
    for n, rate in enumerate((rules.MIN_GROUP_RATE, rules.MAX_GROUP_RATE)):
        rpc.CreateQueue(pb.CreateQueueRequest(name=f"r{n}", type="fair", settings=pb.
                                              QueueSettings(group_rate=rate, group_burst=1)))
        rpc.Enqueue(pb.EnqueueRequest(queueName=f"r{n}", content="a", priority=1, group="g"))
        rpc.Enqueue(pb.EnqueueRequest(queueName=f"r{n}", content="b", priority=1, group="g"))
        assert rpc.Dequeue(pb.DequeueRequest(queueName=f"r{n}", ack=True)).content == "a"
    code, details = refused(lambda: rpc.UpdateQueue(pb.UpdateQueueRequest(
        name="r0", settings=pb.QueueSettings(group_rate=rules.MIN_GROUP_RATE / 2))))
    assert code == SC.INVALID_ARGUMENT and "settings.group_rate" in details, details


def test_schedules(rpc: Rpc) -> None:
    rpc.CreateQueue(pb.CreateQueueRequest(name="s", type="fair",
                                          settings=pb.QueueSettings(ack_timeout=60)))
    definition = pb.ScheduleDefinition(
        name="nightly", cron="30 2 * * *", timezone="Europe/Berlin", catch_up="all",
        message=pb.ScheduleMessage(content="n", priority=3, group="g", metadata={"k": "v"}))
    made = rpc.PutSchedule(pb.PutScheduleRequest(queueName="s", schedule=definition))
    assert (made.status, made.schedule.next_at, made.schedule.schedule.grace) == (
        "CREATED", 1_700_011_800, 60)
    assert made.schedule.schedule.message.metadata == {"k": "v"}
    again = rpc.PutSchedule(pb.PutScheduleRequest(queueName="s", schedule=definition))
    assert again.status == "UNCHANGED"
    tick = pb.ScheduleDefinition(name="tick", every=5, message=pb.ScheduleMessage(content="t"))
    assert rpc.PutSchedule(pb.PutScheduleRequest(queueName="s", schedule=tick,
                                                 paused=True)).schedule.paused
    listed = rpc.GetSchedules(pb.GetSchedulesRequest(queueName="s")).schedules
    assert [x.schedule.name for x in listed] == ["nightly", "tick"]
    one = rpc.GetSchedules(pb.GetSchedulesRequest(queueName="s", name="tick")).schedules
    assert [x.schedule.every for x in one] == [5]
    assert rpc.ResumeSchedule(pb.ScheduleRequest(queueName="s", name="tick")).changed
    assert rpc.PauseSchedule(pb.ScheduleRequest(queueName="s", name="tick")).changed
    assert rpc.DeleteSchedule(pb.ScheduleRequest(queueName="s", name="nightly")).success
    for bad, says in (
            (pb.ScheduleDefinition(name="x", cron="* *", message=pb.ScheduleMessage()),
             "cron: expected five fields"),
            (pb.ScheduleDefinition(name="x", message=pb.ScheduleMessage()), "cron: give either"),
            (pb.ScheduleDefinition(name="x", every=-1, message=pb.ScheduleMessage()),
             "every: expected whole seconds"),
            (pb.ScheduleDefinition(name="", every=1), "name:"),
            (pb.ScheduleDefinition(name="x", every=1, catch_up="most"), "catch_up:"),
            (pb.ScheduleDefinition(name="x", every=1, message=pb.ScheduleMessage(
                metadata={"x-schedule": "forged"})), "schedule.message.metadata"),
            (pb.ScheduleDefinition(name="x", every=1, message=pb.ScheduleMessage(
                priority=-1)), "schedule.message.priority"),
            (pb.ScheduleDefinition(name="x", every=1, start_at=-5), "start_at:")):
        code, details = refused(lambda bad=bad: rpc.PutSchedule(pb.PutScheduleRequest(
            queueName="s", schedule=bad)))
        assert code == SC.INVALID_ARGUMENT and says in details, (bad, details)
    code, details = refused(lambda: rpc.DeleteSchedule(pb.ScheduleRequest(queueName="s",
                                                                          name="nope")))
    assert code == SC.NOT_FOUND and "no schedule 'nope'" in details, details
    assert refused(lambda: rpc.GetSchedules(pb.GetSchedulesRequest(queueName="nope")))[0] == \
        SC.NOT_FOUND
    assert [x.schedule.name for x in rpc.GetSchedules(
        pb.GetSchedulesRequest(queueName="s")).schedules] == ["tick"]


def test_the_tests_here_call_every_rpc(rpc: Rpc) -> None:
    for scenario in (test_queues, test_messages, test_streams, test_dead_letters,
                     test_controls, test_browse_and_explain, test_schedules):
        scenario(rpc)
    rpcs = {m.name for m in pb.DESCRIPTOR.services_by_name["DOQ"].methods}
    assert rpcs - rpc.called == set()


def test_a_full_disk_is_resource_exhausted_for_new_messages(rpc: Rpc, local: LocalNode) -> None:
    delayed(rpc, "q")
    local.service.disk.problem = lambda: "insufficient storage: test"  # type: ignore[method-assign]
    code, details = refused(lambda: rpc.Enqueue(pb.EnqueueRequest(queueName="q", content="x",
                                                                  priority=1)))
    assert code == SC.RESOURCE_EXHAUSTED and "insufficient storage: test" in details


def test_ack_batch_stores_messages_per_id(rpc: Rpc) -> None:
    for name in ("src", "out"):
        delayed(rpc, name)
    rpc.EnqueueBatch(pb.EnqueueBatchRequest(messages=[
        pb.EnqueueRequest(queueName="src", content=f"in{n}", priority=n + 1) for n in range(3)]))
    taken = [rpc.Dequeue(pb.DequeueRequest(queueName="src")) for _ in range(3)]
    answer = rpc.AckBatch(pb.AckBatchRequest(
        queueName="src", ids=[m.id for m in taken], deliveries=[m.delivery for m in taken],
        enqueue=[pb.SettleEnqueue(messages=[pb.EnqueueRequest(queueName="out", content="r",
                                                              priority=1)]),
                 pb.SettleEnqueue(messages=[pb.EnqueueRequest(queueName="nope", content="x",
                                                              priority=1)])]))
    assert list(answer.failed_ids) == [taken[1].id] and "nope" in answer.failures[0]
    assert [len(s.ids) for s in answer.enqueued] == [1, 0, 0]
    assert rpc.GetQueue(pb.GetQueueRequest(name="out")).total == 1
    code, details = refused(lambda: rpc.AckBatch(pb.AckBatchRequest(
        queueName="src", ids=[taken[1].id], enqueue=[pb.SettleEnqueue(), pb.SettleEnqueue()])))
    assert code == SC.INVALID_ARGUMENT and "one list of messages per id" in details
    code, details = refused(lambda: rpc.AckBatch(pb.AckBatchRequest(
        queueName="src", ids=[taken[1].id], enqueue=[pb.SettleEnqueue(messages=[
            pb.EnqueueRequest(queueName="out", content="x", priority=-1)])])))
    assert code == SC.INVALID_ARGUMENT and "enqueue[0].messages[0].priority" in details


def test_an_enqueue_with_a_delay_waits(rpc: Rpc) -> None:
    delayed(rpc, "q")
    held = rpc.Enqueue(pb.EnqueueRequest(queueName="q", content="later", priority=1, delay=30))
    assert refused(lambda: rpc.Dequeue(pb.DequeueRequest(queueName="q", ack=True)))[0] == \
        SC.NOT_FOUND
    reasons = rpc.ExplainMessage(pb.ExplainRequest(queueName="q", id=held.id)).reasons
    assert [r.code for r in reasons] == ["delayed_until"]
    code, details = refused(lambda: rpc.Enqueue(pb.EnqueueRequest(
        queueName="q", content="x", priority=1, delay=30 * 86400 + 1)))
    assert code == SC.INVALID_ARGUMENT and "delay" in details
