"""Operator controls on a real 3-node cluster, through a follower: purge with and
without the delivered messages, pause and resume of a queue with a waiting long-poll and a
waiting DequeueStream (woken on resume, not before), pause of a group and of a sub-group in
round-robin and weighted queues (the other groups keep their order), a pause across a leader
kill -9 and a full restart, refusals that change nothing, the metrics. The replicas' digests
are compared after each test."""
from __future__ import annotations

import itertools
import re
import threading
import time
from typing import Any, Iterator

import grpc
import pytest

from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.grpc.calls import grpc_addr
from tests.grpc.test_api import Subscription
from tests.harness import Cluster, Http, NodeProc, wait_until

pytestmark = pytest.mark.slow
_n = itertools.count()
FLAGS = {"grpc.address": "127.0.0.1:0", "queue.acknowledgement_check_interval": "1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("controls")), size=3, flags=FLAGS).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def via(cluster: Cluster) -> Iterator[Http]:
    """A follower's HTTP API; after the test the replicas must hold identical state."""
    yield cluster.followers()[0].http()
    cluster.assert_replicas_identical(timeout=30)


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_n)}"


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, (r.status, r.body[:400])
    return r.json() if r.body else None


def make(via: Http, name: str, qtype: str = "delayed", **settings: Any) -> str:
    ok(via.post("/API/v1/queues", {"name": name, "type": qtype, "settings": settings}))
    return name


def metric(node: NodeProc, name: str, queue: str) -> float:
    text = node.http().get("/metrics").body.decode()
    found = re.search(rf'^{name}{{queue_name="{re.escape(queue)}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else -1.0


def enqueue(via: Http, queue: str, content: str, group: str = "", priority: int = 1) -> str:
    body: dict[str, Any] = {"content": content, "priority": priority}
    if group:
        body["group"] = group
    return ok(via.post(f"/API/v1/queues/{queue}/messages", body))["id"]  # type: ignore[no-any-return]


def drain(via: Http, queue: str) -> list[str]:
    """Contents in delivery order (acked at delivery) until the queue answers empty."""
    out = []
    for _ in range(1000):
        r = via.get(f"/API/v1/queues/{queue}/messages?ack=true")
        if r.status == 400:
            return out
        out.append(ok(r)["content"])
    raise AssertionError("the queue never ran empty")


def test_purge_with_and_without_the_delivered(cluster: Cluster, via: Http) -> None:
    q = make(via, unique("purge"), "fair")
    for n in range(10):
        enqueue(via, q, f"m{n}", f"g{n % 3}")
    taken = [ok(via.get(f"/API/v1/queues/{q}/messages?ack=false"))["id"] for _ in range(3)]
    ok(via.post(f"/API/v1/queues/{q}/messages/{taken[0]}/nack",
                {"priority": 0, "delay": 600}))                       # held back: waiting
    assert ok(via.post(f"/API/v1/queues/{q}/purge")) == {"status": "PURGED", "purged": 8}
    info = ok(via.get(f"/API/v1/queues/{q}"))
    assert (info["ready"], info["unacked"]) == (0, 2)
    assert via.get(f"/API/v1/queues/{q}/messages?ack=false").status == 400
    ok(via.post(f"/API/v1/queues/{q}/messages/{taken[1]}/ack"))          # consumers go on
    enqueue(via, q, "after", "g0")
    assert ok(via.post(f"/API/v1/queues/{q}/purge", {"include_unacked": True}))["purged"] == 2
    assert ok(via.get(f"/API/v1/queues/{q}"))["total"] == 0
    late = via.post(f"/API/v1/queues/{q}/messages/{taken[2]}/ack")
    assert late.status == 400                                    # purged while delivered
    enqueue(via, q, "fresh", "g1")
    assert drain(via, q) == ["fresh"]
    for node in cluster.nodes:                                   # every replica counted it
        wait_until(lambda node=node: metric(node, "doq_queues_purged_total", q) == 10, 10)


def test_a_paused_queue_wakes_its_waiting_consumers_on_resume_only(
        cluster: Cluster, via: Http) -> None:
    q = make(via, unique("pause"))
    ok(via.post(f"/API/v1/queues/{q}/pause"))
    follower = cluster.followers()[0]
    polled: list[Any] = []

    def long_poll() -> None:
        started = time.monotonic()
        r = follower.http(timeout=30).get(f"/API/v1/queues/{q}/messages?ack=true&wait=15")
        polled.append((time.monotonic() - started, r.status, r.json()))

    poller = threading.Thread(target=long_poll)
    poller.start()
    channel = grpc.insecure_channel(grpc_addr(follower))
    sub = Subscription(pb_grpc.DOQStub(channel), pb.DequeueRequest(queueName=q, ack=True))
    try:
        time.sleep(0.3)
        enqueue(via, q, "one")
        enqueue(via, q, "two")
        assert ok(via.get(f"/API/v1/queues/{q}"))["paused"] is True
        assert metric(follower, "doq_queues_paused", q) == 1
        # paused: neither waiting consumer gets anything, and a plain dequeue says why
        assert sub.nothing_for(2.0)
        assert not polled
        refused = via.get(f"/API/v1/queues/{q}/messages?ack=true")
        assert (refused.status, refused.json()["errors"][0]["message"]) == (
            400, f"Queue is paused: {q}")
        resumed_at = time.monotonic()
        assert ok(via.post(f"/API/v1/queues/{q}/resume")) == {"status": "RESUMED"}
        at, got = sub.receive(timeout=5)
        assert metric(follower, "doq_queues_paused", q) == 0
        assert isinstance(got, pb.DequeueResponse), got
        poller.join(10)
        assert polled and polled[0][1] == 200, polled
        contents = {got.content, polled[0][2]["content"]}
        assert contents == {"one", "two"}                        # each delivered once
        assert at - resumed_at < 3.0
    finally:
        sub.close()
        channel.close()
        poller.join(20)
    assert ok(via.get(f"/API/v1/queues/{q}"))["total"] == 0


@pytest.mark.parametrize("strategy", ["round_robin", "weighted"])
def test_a_paused_group_is_skipped_and_the_others_keep_their_order(
        cluster: Cluster, via: Http, strategy: str) -> None:
    """The same messages in two queues; one has groups a and a.b besides b and c. With a
    paused (which covers a.b), it delivers b and c exactly as the queue that never had a
    does; then a.b alone paused: a's own messages come, a.b's stay."""
    full = make(via, unique(f"groups-{strategy}"), "fair", strategy=strategy)
    plain = make(via, unique(f"plain-{strategy}"), "fair", strategy=strategy)
    for n in range(4):
        for group in ("a", "b", "a.b", "c"):
            enqueue(via, full, f"{group}{n}", group, priority=n % 2 + 1)
            if group in ("b", "c"):
                enqueue(via, plain, f"{group}{n}", group, priority=n % 2 + 1)
    ok(via.post(f"/API/v1/queues/{full}/groups/a/pause"))
    for node in cluster.nodes:
        wait_until(lambda node=node: metric(node, "doq_queues_group_paused", full) == 1, 10)
    groups = {g["group"]: g for g in ok(via.get(f"/API/v1/queues/{full}/groups"))["groups"]}
    assert groups["a.b"]["paused_by"] == "a" and not groups["b"]["paused"]
    assert drain(via, full) == drain(via, plain)
    ok(via.post(f"/API/v1/queues/{full}/groups/a.b/pause"))
    ok(via.post(f"/API/v1/queues/{full}/groups/a/resume"))
    assert sorted(drain(via, full)) == ["a0", "a1", "a2", "a3"]
    ok(via.post(f"/API/v1/queues/{full}/groups/a.b/resume"))
    assert sorted(drain(via, full)) == ["a.b0", "a.b1", "a.b2", "a.b3"]
    assert ok(via.get(f"/API/v1/queues/{full}/groups"))["groups"] == []


def test_browse_pages_over_2500_messages_see_each_once_and_change_nothing(
        cluster: Cluster, via: Http) -> None:
    q = make(via, unique("browse"), "fair", strategy="weighted")
    for n in range(5):
        ok(via.post(f"/API/v1/queues/{q}/messages/batch", {"messages": [
            {"content": f"m{n}-{i}", "priority": i % 4, "group": f"t{i % 7}"}
            for i in range(500)]}))
    taken = {ok(via.get(f"/API/v1/queues/{q}/messages?ack=false"))["id"] for _ in range(40)}
    before = cluster.assert_replicas_identical()[0]["queue_digest"]
    follower = cluster.followers()[1].http()            # another replica answers alike
    for http in (via, follower):
        seen: list[str] = []
        states: dict[str, str] = {}
        after = None
        for _ in range(100):
            query = "browse=true&state=all&limit=97" + (f"&after={after}" if after else "")
            page = ok(http.get(f"/API/v1/queues/{q}/messages?{query}"))
            for m in page["messages"]:
                seen.append(m["id"])
                states[m["id"]] = m["state"]
            after = page["next"]
            if after is None:
                break
        assert len(seen) == len(set(seen)) == 2500
        assert {i for i, s in states.items() if s == "unacked"} == taken
    ready = ok(via.get(f"/API/v1/queues/{q}/messages?browse=true&state=ready&limit=1000"))
    first = [m["id"] for m in ready["messages"][:10]]
    got = [ok(via.get(f"/API/v1/queues/{q}/messages?ack=true"))["id"] for _ in range(10)]
    assert cluster.assert_replicas_identical()[0]["queue_digest"] != before     # taken now
    assert got == first                     # the listing's order is the delivery order


def test_explain_gives_each_reason(via: Http) -> None:
    now = int(time.time())
    d = make(via, unique("why-d"))
    f = make(via, unique("why-f"), "fair", max_unacked=1)

    def explain(queue: str, mid: str) -> Any:
        return ok(via.get(f"/API/v1/queues/{queue}/messages/{mid}/explain"))

    later = enqueue(via, d, "later", priority=now + 3600)
    soon = enqueue(via, d, "soon", priority=1)
    out = explain(d, later)
    assert (out["state"], out["reasons"], out["ahead"]) == (
        "blocked", [{"code": "delayed_until", "until": (now + 3600) * 1000}], 1)
    assert explain(d, soon) == {"id": soon, "state": "ready", "reasons": [], "ahead": 0}
    ok(via.post(f"/API/v1/queues/{d}/pause"))
    assert explain(d, soon)["reasons"] == [{"code": "queue_paused"}]
    ok(via.post(f"/API/v1/queues/{d}/resume"))
    taken = ok(via.get(f"/API/v1/queues/{d}/messages?ack=false"))["id"]
    assert explain(d, taken)["state"] == "unacked"
    ok(via.post(f"/API/v1/queues/{d}/messages/{taken}/nack", {"priority": 0, "delay": 120}))
    out = explain(d, taken)
    assert out["state"] == "blocked" and out["reasons"][0]["code"] == "backoff_until"
    assert abs(out["reasons"][0]["until"] - (time.time() + 120) * 1000) < 30_000
    sub = enqueue(via, f, "sub", "t.sub")
    busy = [enqueue(via, f, f"x{n}", "x") for n in range(2)]
    ok(via.post(f"/API/v1/queues/{f}/groups/t/pause"))
    assert ok(via.get(f"/API/v1/queues/{f}/messages?ack=false"))["id"] == busy[0]
    assert explain(f, sub)["reasons"] == [{"code": "group_paused", "group": "t"}]
    assert explain(f, busy[1])["reasons"] == [
        {"code": "group_at_max_unacked", "group": "x", "unacked": 1, "max": 1}]
    capped = make(via, unique("why-cap"), "fair", max_in_flight=1, group_rate=0.05)
    ids = [enqueue(via, capped, f"c{n}", "g") for n in range(2)]
    assert ok(via.get(f"/API/v1/queues/{capped}/messages?ack=false"))["id"] == ids[0]
    out = explain(capped, ids[1])
    assert out["state"] == "blocked" and out["reasons"][0] == {
        "code": "queue_at_max_in_flight", "in_flight": 1, "max": 1}
    rated = out["reasons"][1]
    assert (rated["code"], rated["group"]) == ("group_rate_limited", "g")
    assert 0 < rated["next_at"] - time.time() * 1000 < 25_000           # 20 s apart
    missing = via.get(f"/API/v1/queues/{f}/messages/99/explain")
    assert (missing.status, missing.json()["code"]) == (400, "message_not_found")


def test_refusals_change_nothing(cluster: Cluster, via: Http) -> None:
    d = make(via, unique("delayed"))
    f = make(via, unique("fair"), "fair")
    enqueue(via, f, "x", "g")
    before = cluster.assert_replicas_identical()[0]["queue_digest"]
    for path, body, status, says in (
            (f"/API/v1/queues/{d}/groups/g/pause", None, 422, "delayed queue"),
            (f"/API/v1/queues/{f}/groups/%20/pause", None, 422, "path.group"),
            (f"/API/v1/queues/{f}/purge", {"include_unacked": 1}, 422, "include_unacked"),
            (f"/API/v1/queues/{f}/purge", {"all": True}, 422, "all"),
            ("/API/v1/queues/missing/pause", None, 400, "Failed to pause a queue"),
            ("/API/v1/queues/missing/purge", None, 400, "Failed to purge a queue")):
        r = via.post(path, body) if body is not None else via.post(path)
        assert r.status == status and says in r.body.decode(), (path, r.status, r.body)
    assert via.get("/API/v1/queues/missing/groups").status == 400
    assert cluster.assert_replicas_identical()[0]["queue_digest"] == before


def test_a_pause_survives_a_leader_kill_and_a_full_restart(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    c = Cluster(str(tmp_path_factory.mktemp("pause-restart")), size=3, flags=FLAGS).start()
    try:
        via = c.followers()[0].http()
        q = make(via, unique("stays"))
        f = make(via, unique("tenants"), "fair", strategy="weighted")
        enqueue(via, q, "held")
        enqueue(via, f, "a-msg", "a")
        enqueue(via, f, "b-msg", "b")
        ok(via.post(f"/API/v1/queues/{q}/pause"))
        ok(via.post(f"/API/v1/queues/{f}/groups/a/pause"))
        c.assert_replicas_identical()
        c.leader().kill()                                        # kill -9
        survivor = next(n for n in c.nodes if n.alive())
        wait_until(lambda: c.leader() is not None, 30)

        def still_paused(node: NodeProc) -> None:
            http = node.http()
            assert ok(http.get(f"/API/v1/queues/{q}"))["paused"] is True
            r = wait_until(lambda: (lambda r: r if r.status != 503 else None)(
                http.get(f"/API/v1/queues/{q}/messages?ack=true")), 30)
            assert r.json()["errors"][0]["message"] == f"Queue is paused: {q}"
            assert ok(http.get(f"/API/v1/queues/{f}/groups"))["groups"][0] == {
                "group": "a", "ready": 1, "unacked": 0, "paused": True}

        still_paused(survivor)
        for node in c.nodes:
            node.stop()
        for node in c.nodes:
            node.start()
        c.wait_ready(60)
        for node in c.nodes:
            still_paused(node)
        http = c.followers()[0].http()
        assert drain(http, f) == ["b-msg"]
        ok(http.post(f"/API/v1/queues/{q}/resume"))
        ok(http.post(f"/API/v1/queues/{f}/groups/a/resume"))
        assert drain(http, q) == ["held"] and drain(http, f) == ["a-msg"]
        c.assert_replicas_identical(timeout=30)
    finally:
        c.stop()
