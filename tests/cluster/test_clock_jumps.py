"""Clock jumps on the leader: its wall clock moved an hour forward or back through
the clock module's fault injection (DOQ_FAULTS_CLOCK_OFFSET_FILE). Messages in flight are not
redelivered early, delayed messages come at their time, writes through followers still go
through and no message id repeats: the node's time follows the wall clock only by slewing
(doq_lib/clock.py), and says how far apart they are (doq_clock_offset_seconds)."""
from __future__ import annotations

import re
import time
from typing import Iterator

import pytest

from tests.harness import Cluster, Http, NodeProc, fault_file, injectable, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with injectable(str(tmp_path_factory.mktemp("clock"))) as c:
        yield c


def jump(node: NodeProc, seconds: float) -> None:
    with open(fault_file(node, "DOQ_FAULTS_CLOCK_OFFSET_FILE"), "w", encoding="ascii") as f:
        f.write(str(seconds))


@pytest.fixture()
def leader(cluster: Cluster) -> Iterator[NodeProc]:
    node = cluster.leader()
    try:
        yield node
    finally:
        for each in cluster.nodes:
            jump(each, 0)


def offset_metric(node: NodeProc) -> float:
    text = node.http().get("/metrics").body.decode()
    found = re.search(r"^doq_clock_offset_seconds ([-0-9.e+]+)$", text, re.M)
    assert found, "doq_clock_offset_seconds is missing"
    return float(found.group(1))


def enqueue(http: Http, queue: str, priority: int, content: str) -> int:
    r = http.post(f"/API/v1/queues/{queue}/messages", {"priority": priority, "content": content})
    assert r.status == 200, r.body
    return int(r.json()["id"])


def test_an_hour_forward_redelivers_nothing_early_and_delays_stay(cluster: Cluster,
                                                                   leader: NodeProc) -> None:
    http = leader.http()
    follower = cluster.followers()[0].http()
    assert http.post("/API/v1/queues", {"name": "forward", "type": "delayed",
                                        "settings": {"ack_timeout": 60}}).status == 200
    first = enqueue(http, "forward", 10, "in flight")
    enqueue(http, "forward", 11, "ready")
    enqueue(http, "forward", int(time.time()) + 40, "delayed 40 s")
    assert http.get("/API/v1/queues/forward/messages?ack=false").json()["id"] == str(first)
    jump(leader, 3600)
    time.sleep(3)                         # three redelivery scans with the jumped wall clock
    info = http.get("/API/v1/queues/forward").json()
    assert (info["ready"], info["unacked"]) == (2, 1), info
    assert http.get("/API/v1/queues/forward/messages?ack=true").json()["content"] == "ready"
    assert http.get("/API/v1/queues/forward/messages?ack=true").status == 400  # not due yet
    later = enqueue(follower, "forward", 12, "through a follower")  # forwarded, not "late"
    assert later > first
    assert offset_metric(leader) > 3500


def test_an_hour_back_keeps_ids_rising_and_delays_on_time(cluster: Cluster,
                                                           leader: NodeProc) -> None:
    http = leader.http()
    assert http.post("/API/v1/queues", {"name": "back", "type": "delayed"}).status == 200
    before = [enqueue(http, "back", 10, f"before {i}") for i in range(5)]
    due = int(time.time()) + 3
    enqueue(http, "back", due, "due in 3 s")
    jump(leader, -3600)
    time.sleep(0.5)                       # the offset file is read every 0.1 s
    after = [enqueue(http, "back", 10, f"after {i}") for i in range(5)]
    assert min(after) > max(before) and len(set(before + after)) == 10
    got = [http.get("/API/v1/queues/back/messages?ack=true").json()["content"]
           for _ in range(10)]
    assert "due in 3 s" not in got
    started = time.monotonic()

    def delayed_delivered() -> bool:
        r = http.get("/API/v1/queues/back/messages?ack=true")
        return r.status == 200 and r.json()["content"] == "due in 3 s"
    wait_until(delayed_delivered, timeout=15, interval=0.2)
    assert time.time() >= due - 1 and time.monotonic() - started < 10
    assert offset_metric(leader) < -3500
