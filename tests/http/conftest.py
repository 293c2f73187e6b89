"""The nodes the REST API tests share (one for the whole package, so splitting the tests by area
starts no extra node): ``node`` / ``http``, ``aux_node`` (2 s ack timeout, fault injection),
``leaderless`` and the ``victim`` queue."""
from __future__ import annotations

import socket
from typing import Iterator

import pytest

from tests.harness import Cluster, Http, NodeProc, free_ports, wait_until
from tests.http.shapes import (
    Victim,
    create,
    dequeue,
    enqueue,
    unique,
)


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="package")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    cluster = Cluster(str(tmp_path_factory.mktemp("http-node")), size=1).start()
    try:
        yield cluster.nodes[0]
    finally:
        cluster.stop()


@pytest.fixture(scope="package")
def http(node: NodeProc) -> Iterator[Http]:
    client = node.http()
    yield client
    client.close()


@pytest.fixture(scope="package")
def aux_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """A second node: 2 s default ack timeout, and the state machine's fault injection on."""
    cluster = Cluster(str(tmp_path_factory.mktemp("http-aux")), size=1,
                      flags={"queue.default_acknowledgement_timeout": "2"},
                      env={"DOQ_FAULTS_ENABLED": "1"}).start()
    try:
        yield cluster.nodes[0]
    finally:
        cluster.stop()


@pytest.fixture(scope="package")
def leaderless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """A node of a three-member cluster whose two peers never answer: it never has a leader.

    The peers' ports stay bound (not listening) by this fixture, so connections to them are
    refused and no other process can take them meanwhile.
    """
    http_port, raft_port = free_ports(2)
    holders = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        holders.append(sock)
    peers = [f"127.0.0.1:{raft_port}"] + [f"127.0.0.1:{s.getsockname()[1]}" for s in holders]
    node = NodeProc("lonely", http_port, raft_port, str(tmp_path_factory.mktemp("lonely")),
                    peers)
    node.start()
    try:
        wait_until(lambda: answers(node, "/livez"), timeout=30, describe=node.tail)
        yield node
    finally:
        node.stop()
        for sock in holders:
            sock.close()


def answers(node: NodeProc, path: str) -> bool:
    client = Http(node.http_port, timeout=2)
    try:
        return client.get(path).status == 200
    finally:
        client.close()


@pytest.fixture(scope="package")
def victim(http: Http) -> Victim:
    queue = unique("victim")
    create(http, queue, "fair", {"max_unacked": 5, "ack_timeout": 600})
    unacked = enqueue(http, queue, 1, "u", group="g", metadata={"k": "u"})["id"]
    ready = enqueue(http, queue, 5, "r", group="g", metadata={"k": "r"})["id"]
    assert dequeue(http, queue)["id"] == unacked
    return Victim(queue, ready, unacked, unique("never"))
