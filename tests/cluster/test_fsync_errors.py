"""A failed journal sync (issue 16): fail-stop. After an fdatasync error the kernel may have
dropped the pages and marked them clean, so no later sync can vouch for those entries: the
node stops at once, says so in its log, and never acknowledges them. The rest of the cluster
goes on and nothing acknowledged is lost; restarted, the node catches up. The error is
injected with DOQ_FAIL_FSYNC_FILE (under DOQ_FAULT_INJECTION=1): while that file exists,
every journal sync of the node counts as failed."""
from __future__ import annotations

import os
from typing import Iterator

import pytest

from tests.harness import Cluster, Http, NodeProc, fault_file, injectable, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture()
def cluster(tmp_path: object) -> Iterator[Cluster]:
    with injectable(str(tmp_path)) as c:
        yield c


def fail_file(node: NodeProc) -> str:
    return fault_file(node, "DOQ_FAIL_FSYNC_FILE")


def enqueue(http: Http, content: str) -> int:
    r = http.post("/API/v1/queues/q/messages", {"priority": 1, "content": content})
    assert r.status == 200, r.body
    return int(r.json()["id"])


@pytest.mark.parametrize("role", ["follower", "leader"])
def test_a_failed_sync_stops_the_node_and_loses_nothing(cluster: Cluster, role: str) -> None:
    leader = cluster.leader()
    victim = leader if role == "leader" else cluster.followers()[0]
    others = [n for n in cluster.nodes if n is not victim]
    http = others[0].http()
    assert http.post("/API/v1/queues", {"name": "q", "type": "delayed"}).status == 200
    acked = [enqueue(http, f"before {i}") for i in range(10)]
    open(fail_file(victim), "w").close()
    # the next write makes every node sync; the victim's sync "fails"
    try:
        acked.append(enqueue(http, "the write that meets the failure"))
    except AssertionError:
        pass                                   # through a dying leader: no answer, no ack
    wait_until(lambda: not victim.alive(), timeout=15, describe=victim.tail)
    assert victim.proc is not None and victim.proc.returncode == 71
    assert "fdatasync failed" in victim.tail(40) and "fail-stop" in victim.tail(40)
    survivor = Http(others[0].http_port, timeout=15)
    wait_until(lambda: survivor.get("/readyz").status == 200, timeout=20)
    acked += [enqueue(survivor, f"after {i}") for i in range(5)]
    os.remove(fail_file(victim))
    victim.start()
    wait_until(victim.ready, timeout=30, describe=victim.tail)
    cluster.assert_replicas_identical(timeout=30)
    got = []
    while (r := survivor.get("/API/v1/queues/q/messages?ack=true")).status == 200:
        got.append(int(r.json()["id"]))
        assert len(got) < 100
    assert set(acked) <= set(got), set(acked) - set(got)
