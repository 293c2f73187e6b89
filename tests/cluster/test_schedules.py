"""Schedules on a real 3-node cluster: created and listed through a follower with both
clients; a schedule every second fires each occurrence exactly once across kill -9 of the
leader, a full restart, a paused queue and an hour's jump of the leader's wall clock (each
stored message names its occurrence in x-scheduled-at: none is missing, none repeats); a
missed occurrence follows catch_up; every replica holds the same and says so in its
metrics."""
from __future__ import annotations

import concurrent.futures
import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

from doq_lib.client import connect
from tests.cluster.test_metrics import scrape
from tests.harness import REPO, Cluster, Http, NodeProc, fault_file, injectable, wait_until

pytestmark = pytest.mark.slow
_n = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with injectable(str(tmp_path_factory.mktemp("schedules")),
                    flags={"grpc.address": "127.0.0.1:0", "prometheus.enabled": "true"}) as c:
        yield c


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, (r.status, r.body[:400])
    return r.json() if r.body else None


def new_queue(http: Http, kind: str = "delayed") -> str:
    name = f"sched-{next(_n)}"
    ok(http.post("/API/v1/queues", {"name": name, "type": kind}))
    return name


def every_second(http: Http, queue: str, name: str = "tick", **extra: Any) -> dict[str, Any]:
    body = {"name": name, "every": 1, "catch_up": "all", "message": {"content": name}, **extra}
    return ok(http.post(f"/API/v1/queues/{queue}/schedules", body))["schedule"]  # type: ignore[no-any-return]


def stored(http: Http, queue: str, name: str = "tick") -> list[int]:
    """The occurrence (unix seconds) of every message schedule ``name`` stored, by id."""
    out, after = [], None
    for _ in range(1000):
        query = "browse=true&state=all&limit=1000" + (f"&after={after}" if after else "")
        page = ok(http.get(f"/API/v1/queues/{queue}/messages?{query}"))
        for m in page["messages"]:
            if m["metadata"]["x-schedule"] == name:
                at = dt.datetime.fromisoformat(m["metadata"]["x-scheduled-at"].replace(
                    "Z", "+00:00"))
                out.append(int(at.timestamp()))
        after = page["next"]
        if after is None:
            return out
    raise AssertionError("more pages than expected")


def stored_all(http: Http, queue: str) -> list[tuple[str, int]]:
    """(schedule, occurrence in unix seconds) of every message of ``queue``."""
    out, after = [], None
    for _ in range(1000):
        query = "browse=true&state=all&limit=1000" + (f"&after={after}" if after else "")
        page = ok(http.get(f"/API/v1/queues/{queue}/messages?{query}"))
        for m in page["messages"]:
            at = dt.datetime.fromisoformat(m["metadata"]["x-scheduled-at"].replace(
                "Z", "+00:00"))
            out.append((m["metadata"]["x-schedule"], int(at.timestamp())))
        after = page["next"]
        if after is None:
            return out
    raise AssertionError("more pages than expected")


def schedule(http: Http, queue: str, name: str = "tick") -> dict[str, Any]:
    return ok(http.get(f"/API/v1/queues/{queue}/schedules/{name}"))  # type: ignore[no-any-return]


def stop_and_check(cluster: Cluster, queue: str, name: str = "tick") -> list[int]:
    """Pause the schedule, then: on every replica, each occurrence from its first to its last
    stored exactly once, as many as the schedule counts."""
    http = cluster.leader().http()
    ok(http.post(f"/API/v1/queues/{queue}/schedules/{name}/pause"))
    cluster.assert_replicas_identical(timeout=30)
    first = None
    for node in cluster.nodes:
        got = stored(node.http(), queue, name)
        assert len(got) == len(set(got)), sorted(t for t in got if got.count(t) > 1)[:5]
        assert sorted(got) == list(range(min(got), max(got) + 1)), "an occurrence is missing"
        assert schedule(node.http(), queue, name)["fired"] == len(got)
        assert first is None or got == first
        first = got
    assert first is not None
    return first


def test_a_schedule_made_through_a_follower_with_both_clients(cluster: Cluster) -> None:
    follower = cluster.followers()[0]
    queue = new_queue(follower.http(), "fair")
    rest = connect(f"http://127.0.0.1:{follower.http_port}")
    made = rest.put_schedule(queue, "tick", "hello", every=1, catch_up="all", group="g.h",
                             metadata={"k": "v"})
    assert (made.status, made.every, made.group, made.metadata) == ("created", 1, "g.h",
                                                                   {"k": "v"})
    grpc_addr = follower.status()["grpc_addr"]
    rpc = connect(f"grpc://{grpc_addr}")
    nightly = rpc.put_schedule(queue, "nightly", "n", cron="30 2 * * *",
                               timezone="Europe/Berlin")
    assert nightly.status == "created" and nightly.next_at > time.time()
    wait_until(lambda: rpc.schedule(queue, "tick").fired >= 4, 30, describe=cluster.describe)
    assert [s.name for s in rest.schedules(queue)] == ["nightly", "tick"]
    assert rest.pause_schedule(queue, "nightly") is True
    rpc.delete_schedule(queue, "nightly")
    got = stop_and_check(cluster, queue)
    assert len(got) >= 4
    for node in cluster.nodes:               # the metrics: the same on every replica
        samples = scrape(node)
        assert samples[("doq_queue_schedules", frozenset({("queue_name", queue)}))] == 1
        assert samples[("doq_queue_schedule_occurrences_total", frozenset({
            ("queue_name", queue), ("outcome", "fired")}))] == len(got)
    taken = rest.dequeue(queue, ack=True)
    assert (taken.content, taken.group, taken.metadata["k"]) == ("hello", "g.h", "v")
    assert taken.metadata["x-schedule"] == "tick"
    rest.close()
    rpc.close()


def test_kill9_of_the_leader_fires_each_occurrence_once(cluster: Cluster) -> None:
    leader = cluster.leader()
    queue = new_queue(leader.http())
    every_second(leader.http(), queue)
    time.sleep(3)
    leader.kill()                                # kill -9, fires in flight
    survivor = cluster.leader(timeout=30)
    fired = schedule(survivor.http(), queue)["fired"]
    wait_until(lambda: schedule(survivor.http(), queue)["fired"] >= fired + 3, 30,
               describe=cluster.describe)
    leader.start()
    cluster.wait_ready(40)
    time.sleep(2)
    got = stop_and_check(cluster, queue)
    assert len(got) >= 8


def test_a_full_restart_fires_what_was_missed_by_catch_up(cluster: Cluster) -> None:
    http = cluster.leader().http()
    queue = new_queue(http)
    every_second(http, queue, "all")
    every_second(http, queue, "none", catch_up="none", grace=1)
    time.sleep(2)
    for node in cluster.nodes:
        node.kill()
    down = time.time()
    time.sleep(5)
    for node in cluster.nodes:
        node.start()
    cluster.wait_ready(60)
    http = cluster.leader().http()
    wait_until(lambda: schedule(http, queue, "all")["last_fired"] > time.time() - 3, 30,
               describe=cluster.describe)
    got = stop_and_check(cluster, queue, "all")        # nothing missing over the downtime
    assert min(got) < down < max(got)
    ok(http.post(f"/API/v1/queues/{queue}/schedules/none/pause"))
    cluster.assert_replicas_identical(timeout=30)
    skipping = stored(http, queue, "none")
    assert len(skipping) == len(set(skipping))
    view = schedule(http, queue, "none")
    assert view["skipped"] >= 3 and view["fired"] == len(skipping)
    missed = [t for t in range(min(skipping), max(skipping)) if t not in skipping]
    assert len(missed) == view["skipped"]


def test_a_paused_queue_holds_its_schedules_and_catches_up_on_resume(
        cluster: Cluster) -> None:
    http = cluster.followers()[0].http()
    queue = new_queue(http)
    every_second(http, queue)
    time.sleep(2)
    ok(http.post(f"/API/v1/queues/{queue}/pause"))
    time.sleep(0.5)
    held = schedule(http, queue)["fired"]
    time.sleep(3)
    assert schedule(http, queue)["fired"] == held            # nothing while paused
    ok(http.post(f"/API/v1/queues/{queue}/resume"))
    wait_until(lambda: schedule(http, queue)["fired"] >= held + 4, 30,
               describe=cluster.describe)
    got = stop_and_check(cluster, queue)
    assert len(got) >= held + 4


def jump(node: NodeProc, seconds: float) -> None:
    with open(fault_file(node, "DOQ_FAULTS_CLOCK_OFFSET_FILE"), "w", encoding="ascii") as f:
        f.write(str(seconds))


def test_an_hour_jump_of_the_leaders_clock_neither_bursts_nor_stalls(
        cluster: Cluster) -> None:
    leader = cluster.leader()
    http = leader.http()
    queue = new_queue(http)
    every_second(http, queue)
    time.sleep(2)
    started = time.time()
    try:
        jump(leader, 3600)
        time.sleep(3)
        jump(leader, -3600)
        time.sleep(3)
    finally:
        jump(leader, 0)
    elapsed = time.time() - started
    got = stop_and_check(cluster, queue)
    # one per second of real time: the node's clock slews, an hour forward fires no backlog
    assert elapsed - 2 <= len([t for t in got if t >= int(started)]) <= elapsed + 2, (
        len(got), elapsed)


# -- 10 queues x 1,000 per-minute schedules, all missed at once ------------------------------
QUEUES, PER_QUEUE = 10, 1000          # PER_QUEUE: the documented maximum of one queue


def _make_schedules(http_port: int, queue: str) -> None:
    http = Http(http_port, timeout=30)
    for n in range(PER_QUEUE):
        ok(http.post(f"/API/v1/queues/{queue}/schedules", {
            "name": f"m{n}", "cron": "* * * * *", "grace": 1, "catch_up": "one",
            "message": {"content": f"{queue}/m{n}"}}))


def test_ten_thousand_missed_schedules_do_not_stop_the_leader_answering(
        cluster: Cluster, tmp_path: Any) -> None:
    """Every per-minute schedule of 10 queues (1,000 each) misses its occurrence while its
    queue is paused, and all 10 queues resume at once: the leader plans and fires them in
    bounded rounds. No node goes 250 ms without answering /livez, leadership does not move,
    each schedule fires its latest missed occurrence exactly once (catch_up one) and moves
    on, and every replica holds the same."""
    leader = cluster.leader()
    http = leader.http()
    queues = [new_queue(http) for _ in range(QUEUES)]
    for queue in queues:
        ok(http.post(f"/API/v1/queues/{queue}/pause"))
    with concurrent.futures.ThreadPoolExecutor(QUEUES) as pool:
        list(pool.map(lambda q: _make_schedules(leader.http_port, q), queues))
    listed = {q: ok(http.get(f"/API/v1/queues/{q}/schedules"))["schedules"] for q in queues}
    assert sum(len(s) for s in listed.values()) == QUEUES * PER_QUEUE
    missed_at = max(s["next_at"] for found in listed.values() for s in found)
    time.sleep(max(0.0, missed_at + 2.5 - time.time()))     # past every one's grace
    term = leader.status()["raft"]["term"]
    stop = tmp_path / "stop"
    probe = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests", "probes", "livez_probe.py"), str(stop)]
        + [f"http://127.0.0.1:{n.http_port}" for n in cluster.nodes],
        stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        resumed = time.time()
        for queue in queues:
            ok(http.post(f"/API/v1/queues/{queue}/resume"))

        def moved_on() -> bool:
            return all(s["next_at"] > resumed for q in queues
                       for s in ok(http.get(f"/API/v1/queues/{q}/schedules"))["schedules"])
        wait_until(moved_on, 120, interval=1.0, describe=cluster.describe)
        time.sleep(1.0)
    finally:
        stop.write_text("stop")
        out, _ = probe.communicate(timeout=30)
    gaps = json.loads(out)
    print("livez gaps:", gaps)
    assert all(g["max_gap"] < 0.25 and g["failures"] == 0 for g in gaps.values()), gaps
    assert cluster.leader() is leader and leader.status()["raft"]["term"] == term
    for queue in queues:
        ok(http.post(f"/API/v1/queues/{queue}/pause"))        # nothing more fires
    cluster.assert_replicas_identical(timeout=60)
    for queue in queues:
        views = ok(http.get(f"/API/v1/queues/{queue}/schedules"))["schedules"]
        got: dict[str, list[int]] = {}
        for name, at in stored_all(http, queue):
            got.setdefault(name, []).append(at)
        first = {v["name"]: v["next_at"] for v in listed[queue]}
        for view in views:
            fired = sorted(got.get(view["name"], []))
            assert len(fired) == len(set(fired)) == view["fired"] >= 1, (queue, view)
            # catch_up one: of the occurrences the pause made it miss (from its first one
            # on), the latest fires once and the others count as skipped; the ones after it
            # fire on time, each once
            latest = fired[0]
            assert latest >= missed_at and latest % 60 == 0, (queue, view, fired)
            assert view["skipped"] == (latest - first[view["name"]]) // 60, (queue, view)
            assert fired == list(range(latest, latest + 60 * len(fired), 60)), fired
