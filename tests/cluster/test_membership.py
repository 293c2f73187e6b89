"""Membership: join through the leader, leave (also the leader), concurrent changes, shutdown."""
from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest

from tests.cluster.test_crash import Load, drain
from tests.harness import (
    Cluster,
    FakeRaftPeer,
    Http,
    NodeProc,
    Response,
    free_ports,
    wait_until,
)

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
    # the removed node, still running, finds out, says so in /readyz and logs it once
    wait_until(lambda: "removed from the cluster" in old.http().get("/readyz").body.decode(),
               40, describe=lambda: old.tail(20))
    assert old.http().get("/readyz").status == 503
    assert old.tail(200).count("no longer a member of the cluster") == 1
    old.stop()
    cluster.nodes.remove(old)
    cluster.assert_replicas_identical()


def test_a_concurrent_membership_change_is_refused_clearly(cluster: Cluster) -> None:
    leader = cluster.leader()
    stopped = cluster.followers()[0]
    stopped.stop()                       # the next change needs 3 of 4 acks: it cannot commit
    ghost = FakeRaftPeer()               # answers the handshake, never acknowledges
    answers: dict[str, Response] = {}

    def join(name: str, addr: str) -> None:
        answers[name] = Http(leader.http_port, timeout=30).post(
            "/API/v1/cluster/join", {"id": name, "addr": addr})

    first = threading.Thread(target=join, args=("ghost-1", ghost.address))
    try:
        first.start()
        time.sleep(0.5)
        second = Http(leader.http_port).post("/API/v1/cluster/join",
                                             {"id": "ghost-2", "addr": "127.0.0.1:1"})
        assert second.status == 409
        message = second.json()["errors"][0]["message"]
        assert "another membership change is in progress" in message
        first.join(timeout=30)
    finally:
        ghost.close()
    # The addition could not commit in time, so it was undone, with the members that answer.
    assert answers["ghost-1"].status == 503
    assert "was undone" in answers["ghost-1"].json()["errors"][0]["message"]
    assert {s["addr"] for s in _servers(leader)} == {n.raft_addr for n in cluster.nodes}
    assert leader.http().post("/API/v1/queues", {"name": "after-undo",
                                                 "type": "delayed"}).status == 200
    stopped.start()
    wait_until(stopped.ready, 30, describe=cluster.describe)
    cluster.assert_replicas_identical()
    assert {"ghost-1", "ghost-2"}.isdisjoint({s["id"] for s in _servers(cluster.leader())})


def test_a_join_of_an_address_that_is_not_a_doq_node_changes_nothing(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Attack 3: one anonymous join of an address nobody listens on used to add a
    voter that never answers, leaving the cluster without a leader for good."""
    c = Cluster(str(tmp_path_factory.mktemp("bogus")), size=1).start()
    try:
        node = c.nodes[0]
        http = node.http()
        assert http.post("/API/v1/queues", {"name": "q", "type": "delayed"}).status == 200
        before = node.state()["queue_digest"]
        unused, = free_ports(1)
        # The HTTP port either waits for the end of a request line (the probe times out) or,
        # when the probe's random nonce happens to hold a newline, answers 400 (not DOQ's
        # reply): both are refusals of an address that does not speak DOQ's Raft protocol.
        for addr, whys in ((f"127.0.0.1:{unused}", ("cannot connect",)),
                           (f"127.0.0.1:{node.http_port}", (
                               "did not complete the Raft handshake",
                               "does not speak DOQ's Raft protocol"))):
            r = http.post("/API/v1/cluster/join", {"id": "evil", "addr": addr})
            assert r.status == 422, r.body
            message = r.json()["errors"][0]["message"]
            assert any(why in message for why in whys), message
        assert node.ready() and len(_servers(node)) == 1
        assert node.state()["queue_digest"] == before
        node.stop()
        node.start()
        c.wait_ready()
        assert len(_servers(node)) == 1
        assert http.post("/API/v1/queues/q/messages", {"content": "x", "priority": 1}
                         ).status == 200
    finally:
        c.stop()


def test_a_node_that_answers_but_never_acknowledges_is_added_then_undone(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    c = Cluster(str(tmp_path_factory.mktemp("undo")), size=1,
                flags={"raft.apply_timeout": "2"}).start()
    ghost = FakeRaftPeer()
    try:
        node = c.nodes[0]
        r = node.http(timeout=30).post("/API/v1/cluster/join",
                                       {"id": "ghost", "addr": ghost.address})
        assert r.status == 503 and "was undone" in r.json()["errors"][0]["message"], r.body
        assert ghost.handshakes >= 1
        wait_until(node.ready, 10, describe=c.describe)
        assert [s["addr"] for s in _servers(node)] == [node.raft_addr]
        assert node.http().post("/API/v1/queues", {"name": "q", "type": "fair"}).status == 200
        node.stop()
        node.start()
        c.wait_ready()
        assert [s["addr"] for s in _servers(node)] == [node.raft_addr]
    finally:
        ghost.close()
        c.stop()


def test_with_a_secret_a_join_must_prove_it(tmp_path_factory: pytest.TempPathFactory) -> None:
    secret = "membership secret, long enough"
    c = Cluster(str(tmp_path_factory.mktemp("secret-join")), size=1,
                flags={"raft.password": secret}).start()
    outsider, insider = FakeRaftPeer(), FakeRaftPeer("another secret entirely")
    try:
        http = c.nodes[0].http()
        r = http.post("/API/v1/cluster/join", {"id": "plain", "addr": outsider.address})
        assert r.status == 422 and "has no cluster secret" in r.json()["errors"][0]["message"]
        r = http.post("/API/v1/cluster/join", {"id": "other", "addr": insider.address})
        assert r.status == 422
        assert "does not know the cluster secret" in r.json()["errors"][0]["message"]
        assert len(_servers(c.nodes[0])) == 1 and c.nodes[0].ready()
    finally:
        outsider.close()
        insider.close()
        c.stop()


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
