"""Issue 27 on real 3-node clusters: no value the API accepts stops a replica, and what the
cluster holds backs up and restores.

The reproductions: ``group_rate`` 5e-324 (accepted before) made the first dequeue kill the
apply pipeline of every node (every write 503, ``/readyz`` still 200) and every restart exit
1; a rate of 1e-13 left a rate record that the restore check refused.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from doq_lib import rules
from tests.cluster.test_backup_cluster import take, upload
from tests.harness import Cluster, running, wait_until

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
        assert limited and limited[0]["next_at"] >= (before + rules.MAX_RATE_INTERVAL) * 1000
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
