"""/metrics on a real 3-node cluster: every SPEC §10 name, and the operator metrics move
under HTTP and gRPC traffic."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.harness import Cluster, NodeProc, wait_until

pytestmark = pytest.mark.timeout(180)

SPEC_NAMES = [
    "doq_queues_enqueue_total", "doq_queues_dequeue_total", "doq_queues_ack_total",
    "doq_queues_nack_total", "doq_queues_messages", "doq_queues_unacked_messages",
    "doq_queues_ready_messages", "doq_grpc_requests_total",
    "doq_grpc_request_duration_seconds_bucket", "doq_http_requests_total",
    "doq_http_request_duration_seconds_bucket", "doq_http_requests_in_progress_total",
]
OPERATOR_NAMES = [
    "doq_raft_role", "doq_raft_term", "doq_raft_commit_index", "doq_raft_applied_index",
    "doq_raft_follower_lag_entries", "doq_raft_entries_proposed_total",
    "doq_raft_ops_proposed_total", "doq_raft_journal_fsyncs_total",
    "doq_raft_journal_fsync_seconds_total", "doq_queues_oldest_message_age_seconds",
    "doq_queues_redelivered_total", "process_resident_memory_bytes", "python_info",
]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(node: NodeProc) -> Samples:
    r = node.http().get("/metrics")
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert found, f"no sample {name} {labels}"
    return sum(found)


def names(samples: Samples) -> set[str]:
    return {n for n, _ in samples}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("metrics")), flags={"grpc.address": "127.0.0.1:0"})
    try:
        yield c.start()
    finally:
        c.stop()


def test_every_metric_is_there_and_moves(cluster: Cluster, tmp_path: Path) -> None:
    leader = cluster.leader()
    follower = cluster.followers()[0]
    before, before_f = scrape(leader), scrape(follower)
    http = leader.http()
    assert http.post("/API/v1/queues", {"name": "m", "type": "delayed"}).status == 200
    ids = []
    for i in range(5):
        r = http.post("/API/v1/queues/m/messages", {"content": f"c{i}", "priority": 1})
        ids.append(r.json()["id"])
    got = http.get("/API/v1/queues/m/messages?ack=false").json()["id"]
    assert http.post(f"/API/v1/queues/m/messages/{got}/ack").status == 200
    got = http.get("/API/v1/queues/m/messages?ack=false").json()["id"]
    assert http.post(f"/API/v1/queues/m/messages/{got}/nack", {"priority": 1}).status == 200
    http.get("/API/v1/queues/m/messages?ack=false")                  # stays unacked

    channel = grpc.insecure_channel(follower.status()["grpc_addr"])
    stub = pb_grpc.DOQStub(channel)
    stub.CreateQueue(pb.CreateQueueRequest(name="r", type="delayed",
                                           settings=pb.QueueSettings(ack_timeout=10)))
    stub.Enqueue(pb.EnqueueRequest(queueName="r", content="x", priority=1))
    stub.Dequeue(pb.DequeueRequest(queueName="r", ack=False))        # redelivered in 10 s
    with pytest.raises(grpc.RpcError) as exc:
        stub.GetQueue(pb.GetQueueRequest(name="nope"))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    stream = stub.EnqueueStream(iter([pb.EnqueueRequest(queueName="r", content=f"s{i}",
                                                        priority=1) for i in range(3)]))
    assert len(list(stream)) == 3
    with grpc.insecure_channel(leader.status()["grpc_addr"]) as lc:
        pb_grpc.DOQStub(lc).GetQueues(pb.GetQueuesRequest())
    time.sleep(1.2)                                                  # the oldest ages

    after = scrape(leader)
    for name in SPEC_NAMES + OPERATOR_NAMES:
        assert name in names(after), name
    q = {"queue_name": "m"}
    assert value(after, "doq_queues_enqueue_total", **q) == 5
    assert value(after, "doq_queues_dequeue_total", **q) == 3
    assert value(after, "doq_queues_ack_total", **q) == 1
    assert value(after, "doq_queues_nack_total", **q) == 1
    assert value(after, "doq_queues_ready_messages", **q) == 3
    assert value(after, "doq_queues_unacked_messages", **q) == 1
    assert value(after, "doq_queues_messages", **q) == 4
    assert value(after, "doq_queues_oldest_message_age_seconds", **q) >= 1.0
    # route templates, never raw paths, as labels
    http_paths = {dict(ls).get("path") for n, ls in after if n == "doq_http_requests_total"}
    assert "/API/v1/queues/<queue_name>/messages" in http_paths
    assert "/API/v1/queues/<queue_name>/messages/<id>/ack" in http_paths
    assert not any(p and str(ids[0]) in p for p in http_paths)
    assert value(after, "doq_http_requests_total", method="POST", status_code="200",
                 path="/API/v1/queues/<queue_name>/messages", service="doq") == 5
    # Raft figures move
    assert value(after, "doq_raft_role", role="leader") == 1
    assert value(after, "doq_raft_term") >= 1
    for name in ("doq_raft_commit_index", "doq_raft_applied_index",
                 "doq_raft_journal_fsyncs_total", "doq_raft_entries_proposed_total",
                 "doq_raft_ops_proposed_total"):
        assert value(after, name) > value(before, name), name
    lag = {dict(ls)["follower"] for n, ls in after if n == "doq_raft_follower_lag_entries"}
    assert lag == {n.raft_addr for n in cluster.nodes if n is not leader}
    assert value(after, "doq_raft_journal_fsync_seconds_total") > 0

    # gRPC calls are counted where they were served, by method and Go-style code name
    def follower_grpc() -> Samples | None:
        s = scrape(follower)
        ok = {"/queue.DOQ/Enqueue", "/queue.DOQ/EnqueueStream"}
        seen = {dict(ls)["method"] for (n, ls), v in s.items()
                if n == "doq_grpc_requests_total" and dict(ls)["code"] == "OK" and v >= 1}
        return s if ok <= seen else None
    f = wait_until(follower_grpc, 10)
    assert value(f, "doq_grpc_requests_total", method="/queue.DOQ/GetQueue",
                 code="NotFound") == 1
    assert value(f, "doq_grpc_request_duration_seconds_count",
                 method="/queue.DOQ/Enqueue") == 1
    assert value(f, "doq_raft_role", role="follower") == 1
    assert value(f, "doq_queues_enqueue_total", queue_name="m") == 5        # applied here too
    assert value(f, "doq_raft_applied_index") > value(before_f, "doq_raft_applied_index")
    assert value(f, "doq_http_requests_in_progress_total") >= 0

    # redelivery after the 10 s ack timeout
    def redelivered() -> float:
        return value(scrape(leader), "doq_queues_redelivered_total", queue_name="r")
    wait_until(lambda: redelivered() == 1, 30)
    channel.close()


def test_metrics_off_by_default(tmp_path: Path) -> None:
    c = Cluster(str(tmp_path), size=1, flags={"prometheus.enabled": "false"}).start()
    try:
        r = c.nodes[0].http().get("/metrics")              # not the web UI's page
        assert r.status == 404 and r.headers["content-type"].startswith(
            "application/problem+json")
    finally:
        c.stop()
