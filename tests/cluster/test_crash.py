"""Durability under kill -9: nothing acknowledged is lost, nothing acknowledged comes back."""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import threading
import time
from http.client import HTTPException
from pathlib import Path
from typing import Callable

import pytest

from tests.harness import Cluster, Http, NodeProc, wait_until

pytestmark = pytest.mark.slow


class Load:
    """Bounded client threads against a set of nodes; they record what the server confirmed."""

    def __init__(self, nodes: list[NodeProc], queue: str) -> None:
        self.nodes = nodes
        self.queue = queue
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.enqueued: list[str] = []          # acknowledged by the server (200)
        self.ids: list[str] = []               # the ids the server assigned to them
        self.consumed: list[str] = []          # delivered AND acknowledged by an ack (200)
        self.in_doubt: set[str] = set()        # ack sent, outcome unknown (connection lost, 5xx)
        self.errors: collections.Counter[str] = collections.Counter()
        self.threads: list[threading.Thread] = []

    def _client(self, worker: int) -> Http:
        return Http(self.nodes[worker % len(self.nodes)].http_port, timeout=10)

    def _loop(self, worker: int, step: Callable[[Http, int], None], limit: int) -> None:
        http, n = self._client(worker), 0
        while not self.stop.is_set() and n < limit:
            try:
                step(http, n)
            except (OSError, HTTPException) as exc:   # node down or restarting: try another
                self.errors[type(exc).__name__] += 1
                http.close()
                worker += 1
                http = self._client(worker)
                time.sleep(0.05)
            n += 1

    def producer(self, worker: int, limit: int = 5000) -> None:
        def step(http: Http, n: int) -> None:
            content = f"w{worker}-{n}"
            r = http.post(f"/API/v1/queues/{self.queue}/messages",
                          {"content": content, "priority": 1})
            if r.status == 200:
                with self.lock:
                    self.enqueued.append(content)
                    self.ids.append(r.json()["id"])
            else:
                self.errors[f"enqueue {r.status}"] += 1
        self._loop(worker, step, limit)

    def consumer(self, worker: int, limit: int = 5000) -> None:
        def step(http: Http, n: int) -> None:
            r = http.get(f"/API/v1/queues/{self.queue}/messages?ack=false")
            if r.status != 200:
                time.sleep(0.01)
                return
            msg = r.json()
            with self.lock:
                self.in_doubt.add(msg["content"])
            a = http.post(f"/API/v1/queues/{self.queue}/messages/{msg['id']}/ack")
            with self.lock:
                if a.status == 200:
                    self.consumed.append(msg["content"])
                if a.status in (200, 400):     # 400: it was not unacked, so not acked by us
                    self.in_doubt.discard(msg["content"])
        self._loop(worker, step, limit)

    def start(self, producers: int, consumers: int = 0) -> None:
        for i in range(producers):
            self.threads.append(threading.Thread(target=self.producer, args=(i,), daemon=True))
        for i in range(consumers):
            self.threads.append(threading.Thread(target=self.consumer, args=(i,), daemon=True))
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def drain(http: Http, queue: str, timeout: float = 30.0) -> list[str]:
    """Dequeue (ack=true) until the queue is empty, waiting for redeliveries of unacked ones."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = http.get(f"/API/v1/queues/{queue}/messages?ack=true")
        if r.status == 200:
            got.append(r.json()["content"])
            continue
        if http.get(f"/API/v1/queues/{queue}").json()["total"] == 0:
            return got
        time.sleep(0.2)
    raise AssertionError(f"queue {queue} did not drain; got {len(got)} so far")


def test_kill9_single_node_under_32_producers_loses_nothing(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    c = Cluster(str(tmp_path_factory.mktemp("crash1")), size=1).start()
    node = c.nodes[0]
    try:
        assert node.http().post("/API/v1/queues", {"name": "c1", "type": "delayed"}).status == 200
        load = Load([node], "c1")
        load.start(producers=32)
        wait_until(lambda: len(load.enqueued) >= 1500, 30)
        node.kill()                                    # SIGKILL while requests are in flight
        load.finish()
        acked = list(load.enqueued)
        node.start()
        wait_until(node.ready, 30, describe=c.describe)
        stored = drain(node.http(), "c1")
        counts = collections.Counter(stored)
        assert not [m for m in acked if counts[m] != 1], "acknowledged message lost or doubled"
        assert max(counts.values()) == 1
    finally:
        c.stop()


@pytest.mark.parametrize("snapshot", [False, True], ids=["journal-only", "snapshot+journal"])
def test_store_left_by_an_os_crash_is_rebuilt_from_snapshot_and_journal(
        tmp_path_factory: pytest.TempPathFactory, snapshot: bool) -> None:
    """The store is not fsynced; after a reboot-crash (boot id changed, no clean close) the node
    must rebuild it from its snapshot and journal instead of trusting it."""
    flags = {"raft.snapshot_min_entries": "30"} if snapshot else {}
    c = Cluster(str(tmp_path_factory.mktemp("oscrash")), size=1, flags=flags).start()
    node = c.nodes[0]
    try:
        http = node.http()
        assert http.post("/API/v1/queues", {"name": "os", "type": "delayed"}).status == 200
        for i in range(80):
            assert http.post("/API/v1/queues/os/messages",
                             {"content": f"m{i}", "priority": i}).status == 200
        for _ in range(10):
            assert http.get("/API/v1/queues/os/messages?ack=true").status == 200
        node.kill()
        marker = os.path.join(node.data_dir, node.node_id, "store", "doq-store.json")
        with open(marker, encoding="utf-8") as f:
            content = json.load(f)
        assert content["clean"] is False
        content["boot_id"] = "a-previous-boot"
        with open(marker, "w", encoding="utf-8") as f:
            json.dump(content, f)
        node.start()
        wait_until(node.ready, 30, describe=c.describe)
        expected = "restoring snapshot" if snapshot else "rebuilding from the journal"
        assert expected in node.tail(100)
        info = http.get("/API/v1/queues/os").json()
        assert (info["ready"], info["unacked"]) == (70, 0)
        got = drain(http, "os")
        assert got == [f"m{i}" for i in range(10, 80)]
    finally:
        c.stop()


def test_kill9_leader_then_everyone_keeps_every_acknowledged_message(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    c = Cluster(str(tmp_path_factory.mktemp("crash3")), size=3,
                flags={"queue.default_acknowledgement_timeout": "2"}).start()
    try:
        leader = c.leader()
        assert leader.http().post("/API/v1/queues", {"name": "c3", "type": "delayed"}).status == 200
        load = Load(c.nodes, "c3")
        load.start(producers=12, consumers=6)
        wait_until(lambda: len(load.consumed) >= 300 and len(load.enqueued) >= 1000, 40)
        leader.kill()
        wait_until(lambda: len(load.enqueued) >= 1600, 40, describe=c.describe)
        c.kill_all()
        load.finish()
        produced, consumed = set(load.enqueued), set(load.consumed)
        assert len(produced) == len(load.enqueued)
        assert len(set(load.ids)) == len(load.ids), "an id was assigned twice across failover"
        for node in c.nodes:
            node.start()
        c.wait_ready(40)
        survivor = c.leader()
        c.assert_replicas_identical(timeout=30)
        remaining = drain(survivor.http(), "c3", timeout=40)
        counts = collections.Counter(remaining)
        assert not (consumed & set(remaining)), "a delivered-and-acked message reappeared"
        lost = produced - consumed - set(remaining) - load.in_doubt
        assert not lost, f"{len(lost)} acknowledged enqueues lost, e.g. {sorted(lost)[:5]}"
        assert len(load.in_doubt) <= 18, "at most one ack in doubt per client and crash"
        assert max(counts.values(), default=1) == 1
        c.assert_replicas_identical()
    finally:
        c.stop()


def test_two_stop_signals_at_once_stop_the_node_once(tmp_path: Path) -> None:
    """A second SIGTERM during shutdown (e.g. from a supervisor and a terminal) is harmless."""
    c = Cluster(str(tmp_path), size=1, flags={"grpc.address": "127.0.0.1:0"}).start()
    node = c.nodes[0]
    assert node.proc is not None
    node.proc.send_signal(signal.SIGTERM)
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(timeout=20) == 0
    log = node.tail(200)
    assert "Traceback" not in log and "closed/deleted" not in log, log


def test_a_node_whose_shutdown_fails_still_exits(tmp_path: Path) -> None:
    """The node's directory removed under it: stopping cannot store the Raft term file, the
    node says so and exits with status 1 instead of hanging after SIGTERM."""
    c = Cluster(str(tmp_path), size=1).start()
    node = c.nodes[0]
    assert node.proc is not None
    assert node.http().post("/API/v1/queues", {"name": "q", "type": "delayed"}).status == 200
    shutil.rmtree(os.path.join(node.data_dir, node.node_id))
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(timeout=30) == 1
    assert "stopping the node failed; exiting anyway" in node.tail(200)
