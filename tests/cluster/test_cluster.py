"""A real 3-node cluster on loopback: forwarding, read-your-writes, bug containment, snapshots."""
from __future__ import annotations

import itertools
import signal
from typing import Iterator

import pytest

from doq_lib.fsm import FAULT_CONTENT
from tests.harness import Cluster, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("cluster")), size=3,
                env={"DOQ_FAULTS_ENABLED": "1"}).start()
    try:
        yield c
        c.assert_replicas_identical()
    finally:
        c.stop()


def _create(node, name: str, qtype: str = "delayed") -> None:  # type: ignore[no-untyped-def]
    r = node.http().post("/API/v1/queues", {"name": name, "type": qtype})
    assert r.status == 200, r.body


def test_three_nodes_elect_one_leader_and_all_are_ready(cluster: Cluster) -> None:
    leader = cluster.leader()
    roles = [n.status()["raft"]["state"] for n in cluster.nodes]
    assert roles.count("leader") == 1
    assert all(n.ready() for n in cluster.nodes)
    servers = cluster.nodes[1].http().get("/API/v1/cluster/servers").json()["servers"]
    assert len(servers) == 3
    assert [s["addr"] for s in servers if s["is_leader"]] == [leader.raft_addr]


def test_followers_accept_writes_and_return_the_leaders_result(cluster: Cluster) -> None:
    follower = cluster.followers()[0]
    _create(follower, "fwd")
    r = follower.http().post("/API/v1/queues/fwd/messages",
                             {"content": "c", "priority": 3, "id": "777"})
    assert r.status == 200 and r.json()["id"] == "777"
    r = follower.http().post("/API/v1/queues/missing/messages", {"content": "c", "priority": 3})
    assert r.status == 409
    assert r.json()["errors"] == [{"message": "Failed to get a queue: missing"}]


def test_write_through_any_node_then_read_through_any_node(cluster: Cluster) -> None:
    _create(cluster.nodes[0], "ryw")
    for writer, reader in itertools.product(cluster.nodes, cluster.nodes):
        r = writer.http().post("/API/v1/queues/ryw/messages",
                               {"content": f"{writer.node_id}->{reader.node_id}", "priority": 1})
        assert r.status == 200, r.body
        got = reader.http().get(f"/API/v1/queues/ryw/messages/{r.json()['id']}")
        assert got.status == 200, got.body
        assert got.json()["content"] == f"{writer.node_id}->{reader.node_id}"


def test_dequeue_and_ack_through_different_nodes(cluster: Cluster) -> None:
    a, b, c = cluster.nodes
    _create(a, "deq")
    mid = a.http().post("/API/v1/queues/deq/messages", {"content": "x", "priority": 1}).json()["id"]
    wait_until(lambda: b.http().get("/API/v1/queues/deq").json()["ready"] == 1)
    r = b.http().get("/API/v1/queues/deq/messages?ack=false")
    assert r.status == 200 and r.json()["id"] == mid
    assert c.http().post(f"/API/v1/queues/deq/messages/{mid}/ack").status == 200
    assert a.http().post(f"/API/v1/queues/deq/messages/{mid}/ack").status == 400
    for node in cluster.nodes:
        wait_until(lambda n=node: n.http().get("/API/v1/queues/deq").json()["total"] == 0)


def test_an_operation_that_hits_a_bug_fails_alone_and_the_cluster_keeps_serving(
        cluster: Cluster) -> None:
    node = cluster.followers()[0]
    _create(node, "bug")
    before = node.http().post("/API/v1/queues/bug/messages", {"content": "ok-1", "priority": 1})
    bad = node.http().post("/API/v1/queues/bug/messages",
                           {"content": FAULT_CONTENT, "priority": 1})
    assert bad.status == 500
    assert bad.json()["detail"] == "Failed to enqueue a message"
    after = node.http().post("/API/v1/queues/bug/messages", {"content": "ok-2", "priority": 1})
    assert before.status == 200 and after.status == 200
    got = [node.http().get("/API/v1/queues/bug/messages?ack=true").json()["content"]
           for _ in range(2)]
    assert got == ["ok-1", "ok-2"]
    assert node.http().get("/API/v1/queues/bug/messages?ack=true").status == 400
    cluster.assert_replicas_identical()


def test_a_leader_a_majority_stopped_answering_is_not_ready_and_refuses_writes(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """/readyz asks what a write asks: a leader whose followers stopped answering (paused, so
    their connections stay open and PySyncObj still counts a quorum) is unready with the
    reason a write gets, long before it steps down; it is ready again once they answer."""
    c = Cluster(str(tmp_path_factory.mktemp("fresh")), size=3,
                flags={"raft.leader_fallback_timeout": "20"}).start()
    try:
        leader = c.leader()
        followers = c.followers()
        _create(leader, "fresh")
        for node in followers:
            node.signal(signal.SIGSTOP)
        try:
            why = "no quorum: a majority has not answered this leader lately"
            probe = wait_until(lambda: (lambda r: r if r.status == 503 else None)(
                leader.http(timeout=3).get("/readyz")), 10, describe=c.describe)
            assert probe.body.decode() == why
            assert leader.status()["raft"]["state"] == "leader"      # not stepped down yet
            r = leader.http().post("/API/v1/queues/fresh/messages", {"content": "x", "priority": 1})
            assert r.status == 503 and r.json()["errors"] == [{"message": why}]
        finally:
            for node in followers:
                node.signal(signal.SIGCONT)
        wait_until(leader.ready, 15, describe=c.describe)
        assert leader.http().post("/API/v1/queues/fresh/messages",
                                  {"content": "y", "priority": 1}).status == 200
    finally:
        c.stop()


def test_a_follower_that_fell_behind_a_snapshot_catches_up(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    c = Cluster(str(tmp_path_factory.mktemp("snap")), size=3,
                flags={"raft.snapshot_min_entries": "40"}).start()
    try:
        leader = c.leader()
        lagging = c.followers()[0]
        _create(leader, "snap")
        lagging.stop()
        http = leader.http()
        for i in range(150):
            assert http.post("/API/v1/queues/snap/messages",
                             {"content": f"m{i}", "priority": i}).status == 200
        for _ in range(20):
            assert http.get("/API/v1/queues/snap/messages?ack=true").status == 200
        wait_until(lambda: leader.status()["raft"]["log_len"] < 100, describe=c.describe)
        lagging.start()
        wait_until(lagging.ready, 30, describe=c.describe)
        c.assert_replicas_identical(timeout=30)
        assert "installing snapshot" in lagging.tail(200)
        assert lagging.http().get("/API/v1/queues/snap").json()["ready"] == 130
    finally:
        c.stop()


def test_a_log_holding_many_bytes_is_snapshotted(tmp_path_factory: pytest.TempPathFactory,
                                                 ) -> None:
    """raft.snapshot_max_log_bytes: large messages trigger a snapshot long before the entry
    count would (the log is held in memory)."""
    c = Cluster(str(tmp_path_factory.mktemp("bytes")), size=1,
                flags={"raft.snapshot_max_log_bytes": str(1 << 20)}).start()
    try:
        node = c.nodes[0]
        _create(node, "big")
        http = node.http()
        for i in range(12):                                   # ~3 MiB in 12 entries
            assert http.post("/API/v1/queues/big/messages",
                             {"content": f"{i}" + "x" * 256_000, "priority": 1}).status == 200
        wait_until(lambda: node.status()["raft"]["log_len"] < 8, describe=c.describe)
        assert http.get("/API/v1/queues/big").json()["ready"] == 12
    finally:
        c.stop()
