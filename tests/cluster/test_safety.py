"""Safety on real 3-node clusters: no value the API accepts stops a replica, and what the
cluster holds backs up and restores.

The reproductions: ``group_rate`` 5e-324 (accepted before) made the first dequeue kill the
apply pipeline of every node (every write 503, ``/readyz`` still 200) and every restart exit
1; a rate of 1e-13 left a rate record that the restore check refused.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from doq_lib import rules
from tests.cluster.test_backup_cluster import take, upload
from tests.harness import Cluster, NodeProc, free_ports, running, wait_until

pytestmark = pytest.mark.timeout(300)


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, (r.status, r.body[:400])
    return r.json() if r.body else None


def test_the_slowest_rate_survives_a_full_restart_a_backup_and_a_restore(
        tmp_path: Path) -> None:
    with running(str(tmp_path), size=3) as cluster:
        via = cluster.followers()[0].http()
        for rate in (5e-324, 1e-13, rules.MIN_GROUP_RATE * 0.99):
            r = via.post("/API/v1/queues", {"name": "slow", "type": "fair",
                                            "settings": {"group_rate": rate}})
            assert r.status == 422 and "body.settings.group_rate" in r.body.decode(), r.body
        assert via.get("/API/v1/queues/slow").status == 400            # nothing created
        ok(via.post("/API/v1/queues", {"name": "slow", "type": "fair", "settings": {
            "group_rate": rules.MIN_GROUP_RATE, "group_burst": rules.MAX_GROUP_BURST}}))
        ok(via.put("/API/v1/queues/slow", {"settings": {"group_rate": rules.MIN_GROUP_RATE,
                                                          "group_burst": 1}}))
        ids = [ok(via.post("/API/v1/queues/slow/messages", {
            "content": c, "priority": 1, "group": "g"}))["id"] for c in ("a", "b")]
        before = time.time()
        assert ok(via.get("/API/v1/queues/slow/messages?ack=true"))["content"] == "a"
        assert via.get("/API/v1/queues/slow/messages?ack=true").status == 400   # held back
        why = ok(via.get(f"/API/v1/queues/slow/messages/{ids[1]}/explain"))
        limited = [r for r in why["reasons"] if r["code"] == "group_rate_limited"]
        assert limited and limited[0]["next_at"] >= (before - 1 + rules.MAX_RATE_INTERVAL) * 1000
        full, _ = take(cluster.leader().http())
        cluster.assert_replicas_identical()

        cluster.kill_all()                                   # every node, then all back
        for node in cluster.nodes:
            node.start()
        cluster.wait_ready(60)
        leader = cluster.leader()
        assert all(node.ready() for node in cluster.nodes)
        via = cluster.followers()[0].http()
        assert via.get("/API/v1/queues/slow/messages?ack=true").status == 400   # still held
        ok(via.post("/API/v1/queues/slow/messages", {"content": "c", "priority": 1,
                                                      "group": "h"}))
        assert ok(via.get("/API/v1/queues/slow/messages?ack=true"))["content"] == "c"
        cluster.assert_replicas_identical()

        ok(upload(leader.http(), full))                     # back to the state before
        wait_until(lambda: via.get("/API/v1/queues/slow").json().get("total") == 1, 30)
        assert via.get("/API/v1/queues/slow/messages?ack=true").status == 400
        cluster.assert_replicas_identical()


def test_refused_values_change_nothing_on_any_replica(tmp_path: Path) -> None:
    """The same refusals over gRPC (the priority and id rules of both transports)."""
    import grpc

    from doq_lib.pb import doq_pb2 as pb
    from doq_lib.pb import doq_pb2_grpc as pb_grpc

    cluster = Cluster(str(tmp_path), size=3, flags={"grpc.address": "127.0.0.1:0"}).start()
    try:
        node = cluster.followers()[0]
        channel = grpc.insecure_channel(str(node.status()["grpc_addr"]))
        stub = pb_grpc.DOQStub(channel)
        stub.CreateQueue(pb.CreateQueueRequest(name="q", type="delayed",
                                               settings=pb.QueueSettings()), timeout=10)
        digest = {s["queue_digest"] for s in cluster.assert_replicas_identical()}
        for request in (pb.EnqueueRequest(queueName="q", content="x", priority=-1),
                        pb.EnqueueRequest(queueName="q", content="x", priority=1, id=2 ** 63)):
            with pytest.raises(grpc.RpcError) as info:
                stub.Enqueue(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as info:
            stub.UpdateQueue(pb.UpdateQueueRequest(name="q", settings=pb.QueueSettings(
                group_rate=5e-324)), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert {s["queue_digest"] for s in cluster.assert_replicas_identical()} == digest
        channel.close()
    finally:
        cluster.stop()


# -- split brain from a stale data folder ---------------------------------
def _cluster_nodes(root: str, ports: list[tuple[int, int]]) -> list[NodeProc]:
    """Three nodes on the given (Raft, HTTP) ports, partners of each other, data under
    ``root`` (as `make run_node_N` starts them: node-N in the same folder)."""
    peers = [f"127.0.0.1:{raft}" for raft, _ in ports]
    return [NodeProc(f"node-{n}", http, raft, root, peers) for n, (raft, http) in
            enumerate(ports)]


def _leaders(nodes: list[NodeProc]) -> set[str]:
    found = set()
    for node in nodes:
        if not node.alive():
            continue
        try:
            raft = node.status()["raft"]
        except OSError:
            continue
        if raft["state"] == "leader":
            found.add(node.node_id)
    return found


def test_the_readme_sequence_makes_one_cluster_and_says_when_to_clear_data(
        tmp_path: Path) -> None:
    """`make run` (a single node, data/node-0), then the three-node section with the same
    ./data: node-0 used to keep its one-node configuration and stay leader while node-1 and
    node-2 elected node-1, all three answered /readyz 200 and writes landed in two
    clusters. Now node-0 refuses to start, saying what to do; doing it gives one cluster."""
    root = str(tmp_path / "data")
    raft_ports, http_ports = free_ports(3), free_ports(3)
    ports = list(zip(raft_ports, http_ports))
    single = NodeProc("node-0", http_ports[0], raft_ports[0], root, [])
    single.start()
    try:
        wait_until(single.ready, 30)
        http = single.http()
        ok(http.post("/API/v1/queues", {"name": "before", "type": "delayed"}))
        ok(http.post("/API/v1/queues/before/messages", {"content": "x", "priority": 1}))
    finally:
        single.stop()
    nodes = _cluster_nodes(root, ports)
    for node in nodes:
        node.start()
    try:
        assert nodes[0].proc is not None and nodes[0].proc.wait(timeout=30) == 1
        said = open(nodes[0].log_path, encoding="utf-8", errors="replace").read()
        assert "cannot start" in said and "a second cluster" in said, said[-2000:]
        assert f"remove {os.path.join(root, 'node-0')}" in said
        assert "no partners (a single-node cluster)" in said
        wait_until(lambda: len(_leaders(nodes)) == 1, 30)
        assert _leaders(nodes) <= {"node-1", "node-2"}
        # follow the advice: clear node-0's data and start it again; it joins the others
        shutil.rmtree(os.path.join(root, "node-0"))
        nodes[0].start()
        wait_until(lambda: all(n.ready() for n in nodes), 60)
        assert len(_leaders(nodes)) == 1
        via = nodes[0].http()
        ok(via.post("/API/v1/queues", {"name": "after", "type": "delayed"}))
        ok(via.post("/API/v1/queues/after/messages", {"content": "y", "priority": 1}))
        cluster = Cluster.__new__(Cluster)
        cluster.nodes = nodes
        states = cluster.assert_replicas_identical(timeout=30)
        assert len({s["queue_digest"] for s in states}) == 1
        ids = {n.status()["cluster_id"] for n in nodes}
        assert len(ids) == 1 and len(ids.pop()) == 32
    finally:
        for node in nodes:
            node.kill(signal.SIGTERM)


def test_a_node_of_another_cluster_is_refused_like_a_stranger(tmp_path: Path) -> None:
    """Cluster A stops; cluster B is made afresh on the same addresses; a node of A started
    with A's data (the same --cluster.peers, so the start-up check passes) is refused in
    every Raft handshake: B's data and leadership stay B's. Pointed at B with other
    partners, or through a join, it refuses to start."""
    raft_ports, http_ports = free_ports(3), free_ports(3)
    ports = list(zip(raft_ports, http_ports))
    a_nodes = _cluster_nodes(str(tmp_path / "a"), ports)
    for node in a_nodes:
        node.start()
    try:
        wait_until(lambda: all(n.ready() for n in a_nodes), 60)
        ok(a_nodes[0].http().post("/API/v1/queues", {"name": "a-only", "type": "delayed"}))
        wait_until(lambda: all(n.status()["cluster_id"] for n in a_nodes), 30)
        a_id = a_nodes[0].status()["cluster_id"]
    finally:
        for node in a_nodes:
            node.kill(signal.SIGTERM)
    b_nodes = _cluster_nodes(str(tmp_path / "b"), ports)
    b = Cluster.__new__(Cluster)
    b.nodes = b_nodes
    for node in b_nodes:
        node.start()
    stale = a_nodes[2]
    try:
        wait_until(lambda: all(n.ready() for n in b_nodes), 60)
        ok(b.leader().http().post("/API/v1/queues", {"name": "b-only", "type": "delayed"}))
        wait_until(lambda: all(n.status()["cluster_id"] for n in b_nodes), 30)
        b_id = b_nodes[0].status()["cluster_id"]
        assert b_id != a_id
        b_nodes[2].kill(signal.SIGTERM)                 # its place is taken by A's node-2
        b_nodes[2].proc = None
        stale.start()
        time.sleep(5)                                    # several election timeouts
        assert stale.alive() and not stale.ready()
        assert stale.status()["cluster_id"] == a_id
        # whichever side accepts a connection (PySyncObj connects one way per pair) says why
        refused = [line for n in b_nodes[:2] + [stale] for line in
                   open(n.log_path, encoding="utf-8", errors="replace").read().splitlines()
                   if "belongs to another cluster" in line]
        assert refused, "the refusal was not logged"
        live = [b_nodes[0], b_nodes[1]]
        assert len(_leaders(live)) == 1 and _leaders([stale]) == set()
        via = live[0].http()
        names = {q["name"] for q in via.get("/API/v1/queues").json()["queues"]}
        assert names == {"b-only"}
        ok(via.post("/API/v1/queues/b-only/messages", {"content": "b", "priority": 1}))
        stale.kill(signal.SIGTERM)
        # the same data pointed at B with other partners, or joining B: refused at start
        lone = NodeProc("node-2", stale.http_port, stale.raft_port, str(tmp_path / "a"),
                        [f"127.0.0.1:{raft_ports[0]}", stale.raft_addr])
        joiner = NodeProc("node-2", stale.http_port, stale.raft_port, str(tmp_path / "a"), [],
                          {"cluster.join_addr": f"127.0.0.1:{http_ports[0]}"})
        for attempt in (lone, joiner):
            attempt.start()
            assert attempt.proc is not None and attempt.proc.wait(timeout=60) == 1
            said = open(attempt.log_path, encoding="utf-8", errors="replace").read()
            assert "cannot start" in said.splitlines()[-1] or "cannot start" in said
    finally:
        for node in b_nodes + [stale]:
            if node.proc is not None:
                node.kill(signal.SIGTERM)
