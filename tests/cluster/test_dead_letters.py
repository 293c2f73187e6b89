"""Delivery counts and dead letters on a real 3-node cluster, through a
follower: max_deliveries after nacks and after ack timeouts, with and without a dead-letter
queue, reject, redrive, the x-* metadata, metrics, validation, and a leader kill -9 in the
middle of a stream of dead-letter moves. The replicas' digests are compared after each
test."""
from __future__ import annotations

import itertools
import re
import threading
import time
from http.client import HTTPException
from typing import Any, Iterator

import pytest

from tests.harness import Cluster, Http, NodeProc, wait_until

pytestmark = pytest.mark.slow
ACK_TIMEOUT = 2                         # seconds: the nodes' default, so redelivery is quick
_n = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("dead")), size=3, flags={
        "queue.default_acknowledgement_timeout": str(ACK_TIMEOUT),
        "queue.acknowledgement_check_interval": "1"}).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def via(cluster: Cluster) -> Iterator[Http]:
    """A follower's HTTP API (its writes are forwarded to the leader); after the test the
    replicas must hold identical state."""
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


def dead_letter_metric(node: NodeProc, queue: str, reason: str) -> float:
    text = node.http().get("/metrics").body.decode()
    found = re.search(rf'^doq_queues_dead_lettered_total{{queue_name="{re.escape(queue)}",'
                      rf'reason="{reason}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_nacked_max_deliveries_times_it_lands_in_the_dlq(cluster: Cluster, via: Http) -> None:
    dlq = make(via, unique("dlq"))
    work = make(via, unique("work"), "fair", max_deliveries=3, dead_letter_queue=dlq)
    base = f"/API/v1/queues/{work}/messages"
    mid = ok(via.post(base, {"content": "job", "priority": 4, "group": "tenant-a",
                             "metadata": {"trace": "t1"}}))["id"]
    for n in (1, 2, 3):
        got = ok(via.get(f"{base}?ack=false"))
        assert (got["id"], got["deliveries"]) == (mid, n)
        assert got.get("last_error") == (f"attempt {n - 1}" if n > 1 else None)
        out = ok(via.post(f"{base}/{mid}/nack", {"priority": 0, "error": f"attempt {n}"}))
        assert out.get("dead_lettered", False) == (n == 3)
    assert ok(via.get(f"/API/v1/queues/{work}"))["total"] == 0
    dead = ok(via.get(f"/API/v1/queues/{dlq}/messages?ack=true"))
    assert dead["content"] == "job" and dead["priority"] == 0 and dead["deliveries"] == 1
    meta = dead["metadata"]
    assert abs(int(meta.pop("x-dead-at")) - time.time() * 1000) < 60_000
    assert meta == {"trace": "t1", "x-dead-reason": "max_deliveries", "x-dead-from": work,
                    "x-deliveries": "3", "x-last-error": "attempt 3"}
    for node in cluster.nodes:                   # counted on every replica
        assert dead_letter_metric(node, work, "max_deliveries") == 1


def test_without_a_dlq_a_spent_message_is_dropped_and_counted(cluster: Cluster,
                                                              via: Http) -> None:
    work = make(via, unique("nodlq"), max_deliveries=1)
    base = f"/API/v1/queues/{work}/messages"
    mid = ok(via.post(base, {"content": "x", "priority": 1}))["id"]
    ok(via.get(f"{base}?ack=false"))
    assert ok(via.post(f"{base}/{mid}/nack", {"priority": 0}))["dead_lettered"]
    assert ok(via.get(f"/API/v1/queues/{work}"))["total"] == 0
    assert via.get(f"{base}/{mid}").status == 400                  # gone
    wait_until(lambda: all(dead_letter_metric(n, work, "max_deliveries") == 1
                           for n in cluster.nodes), timeout=10)


def test_ack_timeouts_count_as_deliveries(cluster: Cluster, via: Http) -> None:
    dlq = make(via, unique("dlq"))
    work = make(via, unique("slow"), max_deliveries=2, dead_letter_queue=dlq)
    base = f"/API/v1/queues/{work}/messages"
    mid = ok(via.post(base, {"content": "stuck", "priority": 1}))["id"]
    first = ok(via.get(f"{base}?ack=false"))
    assert first["deliveries"] == 1
    second = wait_until(lambda: (r := via.get(f"{base}?ack=false")).status == 200 and r.json(),
                        timeout=ACK_TIMEOUT + 10)          # redelivered after its ack timeout
    assert (second["id"], second["deliveries"]) == (mid, 2)
    dead = wait_until(lambda: (r := via.get(f"/API/v1/queues/{dlq}/messages?ack=true"))
                      .status == 200 and r.json(), timeout=ACK_TIMEOUT + 10)
    assert dead["metadata"]["x-dead-reason"] == "max_deliveries"
    assert dead["metadata"]["x-deliveries"] == "2" and "x-last-error" not in dead["metadata"]
    assert ok(via.get(f"/API/v1/queues/{work}"))["total"] == 0


def test_reject_dead_letters_now(cluster: Cluster, via: Http) -> None:
    dlq = make(via, unique("dlq"), "fair")
    work = make(via, unique("rej"), "fair", dead_letter_queue=dlq)
    base = f"/API/v1/queues/{work}/messages"
    mid = ok(via.post(base, {"content": "bad", "priority": 7, "group": "g"}))["id"]
    ok(via.get(f"{base}?ack=false"))
    assert ok(via.post(f"{base}/{mid}/reject", {"error": "cannot parse"})) == {
        "status": "REJECTED", "id": mid}
    dead = ok(via.get(f"/API/v1/queues/{dlq}/messages?ack=true"))
    assert (dead["group"], dead["priority"]) == ("g", 7)          # a fair DLQ keeps both
    assert dead["metadata"]["x-dead-reason"] == "rejected"
    assert dead["metadata"]["x-last-error"] == "cannot parse"
    again = via.post(f"{base}/{mid}/reject")
    assert again.status == 400 and again.json()["code"] == "message_not_unacked"


def test_redrive_by_default_target_to_ids_and_count(cluster: Cluster, via: Http) -> None:
    dlq = make(via, unique("dlq"))
    work = make(via, unique("src"), "fair", dead_letter_queue=dlq)
    other = make(via, unique("other"))
    base = f"/API/v1/queues/{work}/messages"
    ids = []
    for i in range(6):
        ids.append(ok(via.post(base, {"content": f"r{i}", "priority": 2, "group": "g",
                                      "metadata": {"n": str(i)}}))["id"])
        ok(via.get(f"{base}?ack=false"))
        ok(via.post(f"{base}/{ids[-1]}/reject", {"error": "e"}))
    redrive = f"/API/v1/queues/{dlq}/redrive"
    assert ok(via.post(redrive, {"ids": ids[:2]})) == {"moved": 2, "failed": []}
    assert ok(via.post(redrive, {"to": other, "count": 2})) == {"moved": 2, "failed": []}
    assert ok(via.post(redrive, {"ids": [ids[4], "42"]}))["failed"] == [
        {"id": "42", "code": "message_not_found", "detail": f"no message 42 in queue '{dlq}'"}]
    assert ok(via.post(redrive)) == {"moved": 1, "failed": []}          # the rest
    for mid, where in zip(ids, [work, work, other, other, work, work]):
        got = ok(via.get(f"/API/v1/queues/{where}/messages/{mid}"))
        assert got["deliveries"] == 0 and set(got["metadata"]) == {"n"}, got
    assert ok(via.get(f"/API/v1/queues/{dlq}"))["total"] == 0


@pytest.mark.parametrize("overflow", ["reject", "drop_oldest"])
def test_max_messages_holds_under_32_concurrent_producers(cluster: Cluster, via: Http,
                                                          overflow: str) -> None:
    limit = 50
    dlq = make(via, unique("dlq"))
    capped = make(via, unique("cap"), "fair", max_messages=limit, overflow=overflow,
                  dead_letter_queue=dlq)
    base = f"/API/v1/queues/{capped}/messages"
    statuses: list[int] = []
    highest = [0]
    lock = threading.Lock()

    def produce(worker: int) -> None:
        node = cluster.nodes[worker % len(cluster.nodes)]
        http = Http(node.http_port, timeout=15)
        for i in range(8):
            r = http.post(base, {"content": f"{worker}-{i}", "priority": 1, "group": f"g{i}"})
            total = ok(http.get(f"/API/v1/queues/{capped}"))["total"]
            with lock:
                statuses.append(r.status)
                highest[0] = max(highest[0], total)
        http.close()
    producers = [threading.Thread(target=produce, args=(w,)) for w in range(32)]
    for p in producers:
        p.start()
    for p in producers:
        p.join(60)
    info = ok(via.get(f"/API/v1/queues/{capped}"))
    assert info["total"] == limit and highest[0] <= limit
    assert set(statuses) <= {200, 429}
    accepted, refused = statuses.count(200), statuses.count(429)
    dropped = ok(via.get(f"/API/v1/queues/{dlq}"))["total"]
    if overflow == "reject":
        assert (accepted, refused, dropped) == (limit, 32 * 8 - limit, 0)
    else:
        assert (accepted, refused, dropped) == (32 * 8, 0, 32 * 8 - limit)
    for node in cluster.nodes:
        text = node.http().get("/metrics").body.decode()
        found = re.search(rf'^doq_queues_rejected_full_total{{queue_name="{capped}"}} (\S+)$',
                          text, re.M)
        assert found and float(found.group(1)) == refused


def test_dedup_within_the_window_across_a_leader_kill_and_after_it(cluster: Cluster,
                                                                      via: Http) -> None:
    once = make(via, unique("once"), dedup_window=120)
    short = make(via, unique("short"), dedup_window=2)
    base = f"/API/v1/queues/{once}/messages"
    first = ok(via.post(base, {"content": "pay 10", "priority": 1, "dedup_key": "pay-1"}))
    # the producer's retry, through another node: the first id, nothing stored
    other = cluster.nodes[0].http() if cluster.nodes[0].http_port != via.port else \
        cluster.nodes[1].http()
    again = ok(other.post(base, {"content": "pay 10", "priority": 1, "dedup_key": "pay-1"}))
    assert (again["id"], again.get("duplicate")) == (first["id"], True)
    ok(via.get(f"{base}?ack=true"))                       # consumed and acked: still seen
    old = cluster.leader()
    old.kill()
    cluster.leader(timeout=30)
    survivor = next(n for n in cluster.nodes if n is not old).http()
    after_kill = wait_until(lambda: (r := survivor.post(base, {
        "content": "pay 10", "priority": 1, "dedup_key": "pay-1"})).status == 200 and r.json(),
        timeout=30)
    assert (after_kill["id"], after_kill.get("duplicate")) == (first["id"], True)
    old.start()
    cluster.wait_ready(60)
    assert ok(via.get(f"/API/v1/queues/{once}"))["total"] == 0
    # after the window: stored again, with a new id
    sbase = f"/API/v1/queues/{short}/messages"
    one = ok(via.post(sbase, {"content": "x", "priority": 1, "dedup_key": "k"}))
    assert ok(via.post(sbase, {"content": "x", "priority": 1, "dedup_key": "k"}))["duplicate"]
    time.sleep(2.2)
    later = ok(via.post(sbase, {"content": "x", "priority": 1, "dedup_key": "k"}))
    assert "duplicate" not in later and later["id"] != one["id"]
    assert ok(via.get(f"/API/v1/queues/{short}"))["total"] == 2
    for node in cluster.nodes:             # counters since start: the restarted node's are new
        text = node.http().get("/metrics").body.decode()
        found = re.search(rf'^doq_queues_deduplicated_total{{queue_name="{once}"}} (\S+)$',
                          text, re.M)
        assert found and float(found.group(1)) >= (0 if node is old else 2), node.node_id


def test_back_off_and_nack_delay_hold_a_message_back(cluster: Cluster, via: Http) -> None:
    """Not deliverable before its back-off (or delay); deliverable within a small margin
    after it (the leader releases holds on its redelivery timer, once a second here)."""
    queue = make(via, unique("retry"), backoff_initial=2, backoff_max=3)
    base = f"/API/v1/queues/{queue}/messages"
    mid = ok(via.post(base, {"content": "flaky", "priority": 1}))["id"]

    def take() -> Any:
        r = via.get(f"{base}?ack=false")
        return r.json() if r.status == 200 else None
    waits = []
    for expected in (2.0, 3.0):          # 2 s, then min(3, 4) s, plus up to 20 % jitter
        got = take()
        assert got and got["id"] == mid, got
        ok(via.post(f"{base}/{mid}/nack", {"priority": 0, "error": "flaky"}))
        given_back = time.monotonic()
        got = wait_until(take, timeout=expected * 1.2 + 5, interval=0.05)
        waits.append(time.monotonic() - given_back)
        assert got["id"] == mid and got["last_error"] == "flaky"
        assert expected - 0.1 <= waits[-1] <= expected * 1.2 + 2.5, waits
        ok(via.post(f"{base}/{mid}/nack", {"priority": 1}))     # a priority: back at once
    # a nack's own delay, on a queue without back-off
    plain = make(via, unique("delay"))
    pbase = f"/API/v1/queues/{plain}/messages"
    pid = ok(via.post(pbase, {"content": "x", "priority": 1}))["id"]
    ok(via.get(f"{pbase}?ack=false"))
    ok(via.post(f"{pbase}/{pid}/nack", {"priority": 0, "delay": 2}))
    given_back = time.monotonic()
    assert ok(via.get(f"/API/v1/queues/{plain}"))["ready"] == 1
    got = wait_until(lambda: (r := via.get(f"{pbase}?ack=true")).status == 200 and r.json(),
                     timeout=10, interval=0.05)
    assert got["id"] == pid and 1.9 <= time.monotonic() - given_back <= 4.5


def test_ttl_expiry_of_ready_and_of_delayed_messages(cluster: Cluster, via: Http) -> None:
    dlq = make(via, unique("dlq"))
    queue = make(via, unique("ttl"), message_ttl=2, dead_letter_queue=dlq)
    base = f"/API/v1/queues/{queue}/messages"
    ready = ok(via.post(base, {"content": "ready", "priority": 1}))["id"]
    later = ok(via.post(base, {"content": "delayed", "priority": int(time.time()) + 3600}))["id"]
    keep = ok(via.post(base, {"content": "own ttl", "priority": 2, "ttl": 600}))["id"]
    got = ok(via.get(f"{base}/{ready}"))
    assert 0 < got["expires_at"] - time.time() * 1000 <= 2_000 + 1_000
    # nobody dequeues: the leader's sweep dead-letters both within its round after 2 s
    dead = wait_until(lambda: (r := via.get(f"/API/v1/queues/{dlq}")).status == 200
                      and r.json()["total"] == 2 and r.json(), timeout=10)
    assert dead["total"] == 2
    for mid in (ready, later):
        assert via.get(f"{base}/{mid}").status == 400
        meta = ok(via.get(f"/API/v1/queues/{dlq}/messages/{mid}"))["metadata"]
        assert (meta["x-dead-reason"], meta["x-deliveries"]) == ("expired", "0")
    assert ok(via.get(f"{base}?ack=true"))["id"] == keep        # its own ttl: still there


def test_every_refusal_is_clear_and_changes_nothing(cluster: Cluster, via: Http) -> None:
    dlq = make(via, unique("dlq"))
    work = make(via, unique("valid"), max_deliveries=2, dead_letter_queue=dlq)
    before = cluster.leader().state()["queue_digest"]
    cases: list[tuple[str, str, Any, int, str]] = [
        ("POST", "/API/v1/queues", {"name": "n1", "type": "delayed",
                                    "settings": {"dead_letter_queue": "nope"}},
         422, "queue 'nope' does not exist"),
        ("POST", "/API/v1/queues", {"name": "n2", "type": "delayed",
                                    "settings": {"dead_letter_queue": "n2"}},
         422, "its own dead-letter queue"),
        ("POST", "/API/v1/queues", {"name": "n3", "type": "delayed",
                                    "settings": {"max_deliveries": -1}}, 422, ">= 0"),
        ("POST", "/API/v1/queues", {"name": "n4", "type": "delayed",
                                    "settings": {"max_deliveries": "3"}}, 422, "integer"),
        ("POST", "/API/v1/queues", {"name": "n5", "type": "delayed",
                                    "settings": {"dead_letter_queue": "a/b"}}, 422, "'/'"),
        ("PUT", f"/API/v1/queues/{dlq}", {"settings": {"dead_letter_queue": work}},
         422, "cycle"),
        ("DELETE", f"/API/v1/queues/{dlq}", None, 409, f"dead-letter queue of '{work}'"),
        ("POST", f"/API/v1/queues/{work}/messages/123/nack",
         {"priority": 0, "error": "x" * 4097}, 422, "4096 bytes"),
        ("POST", f"/API/v1/queues/{work}/messages/123/reject", {"error": 5}, 422, "string"),
        ("POST", f"/API/v1/queues/{work}/messages/123/reject", None, 400,
         "Failed to reject a message"),
        ("POST", f"/API/v1/queues/{dlq}/redrive", {"to": "ghost"}, 422,
         "to: queue 'ghost' does not exist"),
        ("POST", f"/API/v1/queues/{dlq}/redrive", {"ids": ["1"], "count": 1}, 422,
         "give ids or count"),
        ("POST", "/API/v1/queues/ghost/redrive", None, 400, "Failed to redrive"),
    ]
    for method, path, body, status, said in cases:
        r = via.request(method, path, body=body)
        assert r.status == status and said in r.body.decode(), (method, path, r.status, r.body)
    assert cluster.leader().state()["queue_digest"] == before


def test_a_leader_kill_in_a_stream_of_dead_letter_moves_loses_and_doubles_nothing(
        cluster: Cluster, via: Http) -> None:
    dlq = make(via, unique("dlq"))
    work = make(via, unique("stream"), max_deliveries=1, dead_letter_queue=dlq)
    base = f"/API/v1/queues/{work}/messages"
    contents = [f"m{i}" for i in range(300)]
    for start in range(0, len(contents), 100):
        ok(via.post(f"{base}/batch", {"messages": [
            {"content": c, "priority": 1} for c in contents[start:start + 100]]}))
    stop = threading.Event()

    def consume(node: NodeProc) -> None:
        # dequeue and give back at once: with max_deliveries 1 every nack is a move to the DLQ
        http = Http(node.http_port, timeout=5)
        while not stop.is_set():
            try:
                r = http.get(f"{base}?ack=false")
                if r.status == 200:
                    http.post(f"{base}/{r.json()['id']}/nack", {"priority": 0})
                else:
                    time.sleep(0.05)
            except (OSError, HTTPException):           # the node is down: a new connection
                http.close()
                http = Http(node.http_port, timeout=5)
                time.sleep(0.1)
    workers = [threading.Thread(target=consume, args=(n,), daemon=True)
               for n in cluster.nodes for _ in range(2)]
    for w in workers:
        w.start()
    try:
        wait_until(lambda: ok(via.get(f"/API/v1/queues/{dlq}"))["total"] >= 60, timeout=60)
        old = cluster.leader()
        old.kill()
        time.sleep(1.5)
        old.start()
        cluster.wait_ready(60)
        # everything either moves or comes back after its ack timeout and then moves
        wait_until(lambda: ok(cluster.nodes[0].http().get(f"/API/v1/queues/{work}"))
                   ["total"] == 0, timeout=90)
    finally:
        stop.set()
        for w in workers:
            w.join(15)
    states = cluster.assert_replicas_identical(timeout=30)
    assert len({s["digest"] for s in states}) == 1
    http = cluster.leader().http()
    got = []
    while (r := http.get(f"/API/v1/queues/{dlq}/messages?ack=true")).status == 200:
        got.append(r.json()["content"])
        assert len(got) <= len(contents)
    assert sorted(got) == sorted(contents)               # each one exactly once


def _contents(via: Http, queue: str) -> list[str]:
    page = ok(via.get(f"/API/v1/queues/{queue}/messages?browse=true&state=all&limit=100"))
    return sorted(m["content"] for m in page["messages"])


def test_a_batch_whose_drop_takes_the_message_it_names_is_whole_or_refused(via: Http) -> None:
    """A drop_oldest queue whose dead-letter queue has room for one: a batch of a new message
    and one naming the oldest waiting message. The drop that makes room for the first never
    takes the one the second names (it replaces it), so the batch stores both; the same
    with no room left is refused whole (429), with nothing changed."""
    dlq = make(via, unique("aon-dlq"), max_messages=1, overflow="reject")
    queue = make(via, unique("aon"), max_messages=2, overflow="drop_oldest",
                 dead_letter_queue=dlq)
    base = f"/API/v1/queues/{queue}/messages"
    first = ok(via.post(base, {"content": "old-1", "priority": 1}))["id"]
    ok(via.post(base, {"content": "old-2", "priority": 1}))
    ok(via.post(f"{base}/batch", {"messages": [
        {"content": "new", "priority": 1}, {"id": first, "content": "named", "priority": 1}]}))
    assert _contents(via, queue) == ["named", "new"] and _contents(via, dlq) == ["old-2"]
    before = (_contents(via, queue), _contents(via, dlq))
    r = via.post(f"{base}/batch", {"messages": [
        {"content": "more", "priority": 1}, {"id": first, "content": "again", "priority": 1}]})
    assert r.status == 429 and "Traceback" not in r.body.decode(), r.body[:300]
    assert (_contents(via, queue), _contents(via, dlq)) == before
    # the same as a settle's enqueue: refused whole, the message stays delivered
    taken = ok(via.get(f"{base}?ack=false"))
    r = via.post(f"{base}/{taken['id']}/nack", {"delivery": taken["delivery"], "enqueue": [
        {"queue": queue, "content": "more", "priority": 1},
        {"queue": queue, "id": first, "content": "again", "priority": 1}]})
    assert r.status == 429 and "Traceback" not in r.body.decode(), r.body[:300]
    assert ok(via.get(f"/API/v1/queues/{queue}"))["unacked"] == 1
    assert (_contents(via, queue), _contents(via, dlq)) == before
