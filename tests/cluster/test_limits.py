"""Delivery limits on a real 3-node cluster under 32 concurrent consumers through
a follower: max_in_flight is never exceeded, and each group's delivery rate over 10 s is
within 10 % of its group_rate while the other groups are served. Replica digests are
compared after each test; the metrics count what happened."""
from __future__ import annotations

import itertools
import re
import threading
import time
from typing import Any, Iterator

import pytest

from tests.harness import Cluster, Http, NodeProc, wait_until

pytestmark = pytest.mark.slow
CONSUMERS = 32
_n = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("limits")), size=3).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def follower(cluster: Cluster) -> Iterator[NodeProc]:
    yield cluster.followers()[0]
    cluster.assert_replicas_identical(timeout=30)


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, (r.status, r.body[:400])
    return r.json() if r.body else None


def fill(via: Http, queue: str, groups: list[str], per_group: int) -> None:
    for group in groups:
        for start in range(0, per_group, 500):
            ok(via.post(f"/API/v1/queues/{queue}/messages/batch", {"messages": [
                {"content": f"{group}-{n}", "priority": 1, "group": group}
                for n in range(start, min(per_group, start + 500))]}))


def consumers(node: NodeProc, queue: str, ack: bool, until: float, handle: Any,
              halt: threading.Event | None = None) -> list[threading.Thread]:
    """CONSUMERS threads long-polling ``queue`` on ``node`` until ``until`` (monotonic) or
    ``halt``; ``handle(http, message)`` is called for each message taken."""
    def run() -> None:
        http = node.http(timeout=30)
        while time.monotonic() < until and not (halt is not None and halt.is_set()):
            left = max(0.1, min(2.0, until - time.monotonic()))
            r = http.get(f"/API/v1/queues/{queue}/messages?ack={str(ack).lower()}"
                         f"&wait={left:.1f}")
            if r.status == 200:
                handle(http, r.json())
            elif r.status != 400:
                raise AssertionError((r.status, r.body[:200]))
    threads = [threading.Thread(target=run, daemon=True) for _ in range(CONSUMERS)]
    for t in threads:
        t.start()
    return threads


def metric(node: NodeProc, name: str, queue: str) -> float:
    text = node.http().get("/metrics").body.decode()
    found = re.search(rf'^{name}{{queue_name="{re.escape(queue)}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else -1.0


def test_max_in_flight_is_never_exceeded_by_32_consumers(
        cluster: Cluster, follower: NodeProc) -> None:
    via, cap, total = follower.http(), 5, 160
    queue = f"capped-{next(_n)}"
    ok(via.post("/API/v1/queues", {"name": queue, "type": "fair",
                                   "settings": {"max_in_flight": cap}}))
    fill(via, queue, [f"g{n}" for n in range(8)], total // 8)
    lock = threading.Lock()
    held, most, done = [0], [0], [0]
    sampled: list[int] = []

    def handle(http: Http, message: dict[str, Any]) -> None:
        with lock:
            held[0] += 1
            most[0] = max(most[0], held[0])
        time.sleep(0.02)
        with lock:
            held[0] -= 1
            done[0] += 1
        ok(http.post(f"/API/v1/queues/{queue}/messages/{message['id']}/ack"))

    stop, halt = time.monotonic() + 90, threading.Event()
    threads = consumers(follower, queue, False, stop, handle, halt)
    watcher = cluster.leader().http()
    while done[0] < total and time.monotonic() < stop:
        sampled.append(ok(watcher.get(f"/API/v1/queues/{queue}"))["unacked"])
        time.sleep(0.05)
    halt.set()
    stop_all(threads)
    assert done[0] == total, done
    assert 1 < most[0] <= cap and max(sampled) <= cap, (most, max(sampled))
    assert ok(via.get(f"/API/v1/queues/{queue}"))["total"] == 0


def stop_all(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)


def test_each_group_keeps_its_rate_under_32_consumers(
        cluster: Cluster, follower: NodeProc) -> None:
    rate, window = 5.0, 10.0
    queue = f"rated-{next(_n)}"
    via = follower.http()
    ok(via.post("/API/v1/queues", {"name": queue, "type": "fair", "settings": {
        "group_rate": rate, "group_burst": 2, "strategy": "weighted"}}))
    fill(via, queue, ["a", "b", "c"], 150)
    ok(via.post(f"/API/v1/queues/{queue}/messages", {"content": "free", "priority": 1,
                                                      "group": "neighbour"}))
    times: dict[str, list[float]] = {}
    lock = threading.Lock()

    def handle(http: Http, message: dict[str, Any]) -> None:
        with lock:
            times.setdefault(message["group"], []).append(time.monotonic())

    start = time.monotonic()
    threads = consumers(follower, queue, True, start + window + 2.5, handle)
    stop_all(threads)
    for group in ("a", "b", "c"):
        seen = [t for t in times[group] if start + 1.0 <= t < start + 1.0 + window]
        assert abs(len(seen) - rate * window) <= 0.1 * rate * window, (group, len(seen))
    assert times["neighbour"][0] - start < 1.0            # not held up
    wait_until(lambda: metric(follower, "doq_queues_rate_limited_total", queue) > 100, 10)
