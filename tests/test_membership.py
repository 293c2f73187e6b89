"""Membership: join through the leader, leave (also the leader), concurrent changes, shutdown."""
from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest

from tests.harness import Cluster, Http, NodeProc, free_ports, wait_until
from tests.test_crash import Load, drain

pytestmark = pytest.mark.slow


@pytest.fixture()
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("members")), size=3).start()
    try:
        yield c
    finally:
        c.stop()


def _servers(node: NodeProc) -> list[dict]:  # type: ignore[type-arg]
    return node.http().get("/API/v1/cluster/servers").json()["servers"]


def _joiner(c: Cluster, name: str, via: NodeProc) -> NodeProc:
    http_port, raft_port = free_ports(2)
    node = NodeProc(name, http_port, raft_port, c.nodes[0].data_dir, [],
                    {"cluster.join_addr": f"127.0.0.1:{via.http_port}"})
    c.nodes.append(node)
    node.start()
    return node


def test_join_a_fourth_node_under_load_then_remove_it(cluster: Cluster) -> None:
    leader = cluster.leader()
    assert leader.http().post("/API/v1/queues", {"name": "m", "type": "delayed"}).status == 200
    load = Load(cluster.nodes[:3], "m")
    load.start(producers=6)
    try:
        wait_until(lambda: len(load.enqueued) >= 200, 20)
        fourth = _joiner(cluster, "node-3", via=cluster.followers()[0])
        wait_until(fourth.ready, 30, describe=cluster.describe)
        wait_until(lambda: {s["id"] for s in _servers(cluster.nodes[0])} ==
                   {"node-0", "node-1", "node-2", "node-3"}, 10)
        listed = {s["id"]: s for s in _servers(fourth)}
        assert listed["node-3"]["addr"] == fourth.raft_addr
        assert listed["node-3"]["http_addr"].endswith(f":{fourth.http_port}")
        assert sum(s["is_leader"] for s in listed.values()) == 1
        assert all(s["lag"] is not None for s in listed.values())
        wait_until(lambda: len(load.enqueued) >= 600, 30)
        r = cluster.nodes[1].http().post("/API/v1/cluster/leave", {"id": "node-3"})
        assert r.status == 200 and r.json() == {"id": "node-3"}
        wait_until(lambda: len(load.enqueued) >= 900, 30)
    finally:
        load.finish()
    assert {s["id"] for s in _servers(cluster.nodes[0])} == {"node-0", "node-1", "node-2"}
    r = fourth.http().post("/API/v1/queues/m/messages", {"content": "late", "priority": 1})
    assert r.status == 503, "a removed node must stop accepting writes"
    fourth.stop()
    cluster.nodes.remove(fourth)
    states = cluster.assert_replicas_identical()
    assert len(states) == 3
    remaining = drain(cluster.leader().http(), "m")
    assert set(load.enqueued) <= set(remaining) and len(remaining) == len(set(remaining))


def test_removing_the_leader_hands_leadership_over_first(cluster: Cluster) -> None:
    old = cluster.leader()
    r = old.http().post("/API/v1/cluster/leave", {"id": old.node_id})
    assert r.status == 200, r.body
    rest = [n for n in cluster.nodes if n is not old]
    new = wait_until(lambda: next((n for n in rest if n.status()["raft"]["state"] == "leader"),
                                  None), 10)
    wait_until(lambda: {s["id"] for s in _servers(new)} == {n.node_id for n in rest}, 10)
    assert new.http().post("/API/v1/queues", {"name": "after", "type": "fair"}).status == 200
    old.stop()
    cluster.nodes.remove(old)
    cluster.assert_replicas_identical()


def test_a_concurrent_membership_change_is_refused_clearly(cluster: Cluster) -> None:
    leader = cluster.leader()
    stopped = cluster.followers()[0]
    stopped.stop()                       # the next change needs 3 of 4 acks: it cannot commit
    answers: dict[str, object] = {}

    def join(name: str, port: int) -> None:
        answers[name] = Http(leader.http_port, timeout=20).post(
            "/API/v1/cluster/join", {"id": name, "addr": f"127.0.0.1:{port}"})

    first = threading.Thread(target=join, args=("ghost-1", free_ports(1)[0]))
    first.start()
    time.sleep(0.5)
    second = Http(leader.http_port).post("/API/v1/cluster/join",
                                         {"id": "ghost-2", "addr": "127.0.0.1:1"})
    assert second.status == 409
    assert "another membership change is in progress" in second.json()["errors"][0]["message"]
    stopped.start()                      # now the first change can commit
    first.join(timeout=30)
    wait_until(stopped.ready, 30, describe=cluster.describe)
    leader = cluster.leader()
    r = leader.http().post("/API/v1/cluster/leave", {"id": "ghost-1"})
    assert r.status in (200, 404), r.body   # 404 if the first join timed out before commit
    assert "ghost-2" not in {s["id"] for s in _servers(leader)}


def test_membership_requests_are_validated(cluster: Cluster) -> None:
    http = cluster.nodes[0].http()
    assert http.post("/API/v1/cluster/join", {"id": "x"}).status == 422
    r = http.post("/API/v1/cluster/join", {"id": "x", "addr": "no-port"})
    assert r.status == 422 and "host:port" in r.json()["errors"][0]["message"]
    r = http.post("/API/v1/cluster/leave", {"id": "nobody"})
    assert r.status == 404 and "nobody" in r.json()["errors"][0]["message"]
    assert len(_servers(cluster.nodes[0])) == 3


def test_stopping_the_leader_hands_leadership_over(cluster: Cluster) -> None:
    old = cluster.leader()
    started = time.monotonic()
    old.stop()
    rest = [n for n in cluster.nodes if n is not old]
    wait_until(lambda: any(n.status()["raft"]["state"] == "leader" for n in rest), 10)
    assert time.monotonic() - started < 5
    assert "leadership handed over to" in old.tail(50)
    old.start()
    wait_until(old.ready, 30, describe=cluster.describe)
    cluster.assert_replicas_identical()
