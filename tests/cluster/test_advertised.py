"""Advertised addresses (http.advertise, grpc.advertise): the cluster lists, for clients,
the addresses each node is published as, apart from those the nodes use between themselves.

Each node listens on its own loopback address only (127.0.0.1, .2, .3) and advertises a port
on 127.0.0.1 where a forwarder of this test passes the bytes on: a client that follows the
listing reaches a node only through its forwarder, which counts what came through it, as a
client on a docker host reaches a container only through its published port."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from doq_lib.client import connect
from doq_lib.errors import Unavailable
from tests.harness import DOQ, Cluster, free_ports, wait_until


class Forwarder:
    """A TCP port on 127.0.0.1 that passes each connection on to ``target``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.listener.close()


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[Cluster, list[Forwarder], list[Forwarder]]]:
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    cluster = Cluster(str(tmp_path_factory.mktemp("advertised")), size=3, hosts=hosts)
    grpc_ports = free_ports(3)
    http = [Forwarder((n.host, n.http_port)) for n in cluster.nodes]
    grpc = [Forwarder((n.host, port)) for n, port in zip(cluster.nodes, grpc_ports)]
    for i, node in enumerate(cluster.nodes):
        node.flags.update({"grpc.address": f"{node.host}:{grpc_ports[i]}",
                           "http.advertise": f"127.0.0.1:{http[i].port}",
                           "grpc.advertise": f"127.0.0.1:{grpc[i].port}"})
    cluster.start()
    try:
        yield cluster, http, grpc
    finally:
        cluster.stop()
        for f in http + grpc:
            f.close()


def test_the_listing_names_the_advertised_addresses_and_the_peer_ones(
        published: tuple[Cluster, list[Forwarder], list[Forwarder]]) -> None:
    cluster, http, grpc = published
    url = f"http://127.0.0.1:{http[1].port}"
    deadline = time.monotonic() + 20
    with connect(url) as client:
        while True:           # until every member has announced its addresses
            servers = {s.id: s for s in client.servers()}
            if {n.node_id for n in cluster.nodes} <= set(servers) and \
                    all(s.peer_grpc_addr for s in servers.values()):
                break
            assert time.monotonic() < deadline, servers
            time.sleep(0.2)
    for i, node in enumerate(cluster.nodes):
        listed = servers[node.node_id]
        assert (listed.http_addr, listed.grpc_addr) == (f"127.0.0.1:{http[i].port}",
                                                        f"127.0.0.1:{grpc[i].port}")
        assert listed.peer_http_addr == f"{node.host}:{node.http_port}"
        assert listed.peer_grpc_addr.startswith(f"{node.host}:")


def test_clients_and_the_cli_follow_the_leader_to_its_advertised_address(
        published: tuple[Cluster, list[Forwarder], list[Forwarder]], tmp_path: Path) -> None:
    cluster, http, grpc = published
    leader = cluster.nodes.index(cluster.leader())
    follower = (leader + 1) % 3
    url = f"http://127.0.0.1:{http[follower].port}"
    before_http, before_grpc = http[leader].accepted, grpc[leader].accepted

    out = tmp_path / "full.bak"
    done = subprocess.run([sys.executable, DOQ, "backup", "--url", url, "--output", str(out)],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0
    assert http[leader].accepted > before_http, "the backup went to the leader's address"

    with connect(url, transport="grpc") as client:
        client.create_queue("advertised")
        client.enqueue("advertised", "through the published gRPC port")
        assert client.dequeue("advertised", ack=True).content == \
            "through the published gRPC port"
    assert grpc[leader].accepted > before_grpc, "gRPC went to the leader's advertised address"


@pytest.fixture(scope="module")
def unresolvable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Nodes that advertise names nothing resolves (as compose's container names are on the
    host, without --http.advertise): the tools have only the URL they were given."""
    cluster = Cluster(str(tmp_path_factory.mktemp("unresolvable")), size=3)
    grpc_ports = free_ports(3)
    for i, node in enumerate(cluster.nodes):
        node.flags.update({"grpc.address": f"127.0.0.1:{grpc_ports[i]}",
                           "http.advertise": f"node-{i}.invalid:8000",
                           "grpc.advertise": f"node-{i}.invalid:10000"})
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _doq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, DOQ, *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))


def test_backup_and_restore_through_a_follower_whose_leader_does_not_resolve(
        unresolvable: Cluster, tmp_path: Path) -> None:
    """The CLI cannot reach the leader's listed address, so it goes through the follower it
    was given, which relays the backup (streamed) and the restore to the leader."""
    cluster = unresolvable
    follower = cluster.followers()[0]
    url = f"http://127.0.0.1:{follower.http_port}"
    with connect(url) as client:
        wait_until(lambda: len(listed := client.servers()) == 3 and
                   all(s.http_addr.endswith(".invalid:8000") for s in listed), 20,
                   describe=lambda: str(client.servers()))
        client.create_queue("relayed")
        for n in range(5):
            client.enqueue("relayed", f"m{n}")
        full, incremental = tmp_path / "full.bak", tmp_path / "incr.bak"
        done = _doq("backup", "--url", url, "--output", str(full))
        assert done.returncode == 0, done.stderr
        since = done.stdout.strip()
        client.enqueue("relayed", "m5")
        done = _doq("backup", "--url", url, "--output", str(incremental), "--since", since)
        assert done.returncode == 0, done.stderr
        client.delete_queue("relayed")
        done = _doq("restore", "--url", url, "--full", str(full), "--incremental",
                    str(incremental))
        assert done.returncode == 0, done.stderr
        assert client.queue("relayed").total == 6


def test_a_relayed_request_that_finds_no_leader_is_refused(unresolvable: Cluster) -> None:
    follower = unresolvable.followers()[0]
    r = follower.http().post("/db/backup", {"since": 0}, headers={"X-DOQ-Relayed": "1"})
    assert r.status >= 400 and "relayed to a node that does not lead" in r.body.decode(), r.body


def test_clients_work_with_only_the_url_they_were_given(unresolvable: Cluster) -> None:
    cluster = unresolvable
    follower = cluster.followers()[0]
    with connect(f"http://127.0.0.1:{follower.http_port}") as client:
        client.create_queue("given")
        client.enqueue("given", "over http")
        assert client.dequeue("given", ack=True).content == "over http"
    grpc_addr = follower.flags["grpc.address"]
    # found through the HTTP API, the listed gRPC names cannot be used: a clear error at once
    began = time.monotonic()
    with pytest.raises(Unavailable, match="none of those names resolves here: connect with the "
                       "nodes' grpc:// URLs"):
        connect(f"http://127.0.0.1:{follower.http_port}", transport="grpc")
    assert time.monotonic() - began < 5
    with connect(f"grpc://{grpc_addr}") as grpc_client:
        grpc_client.enqueue("given", "over grpc")
        assert grpc_client.dequeue("given", ack=True).content == "over grpc"

    async def by_asyncio() -> None:
        from doq_lib.client import connect_async
        with pytest.raises(Unavailable, match="none of those names resolves here"):
            await connect_async(f"http://127.0.0.1:{follower.http_port}", transport="grpc")
        async with await connect_async(f"http://127.0.0.1:{follower.http_port}") as aclient:
            await aclient.enqueue("given", "over asyncio")
            assert (await aclient.dequeue("given", ack=True)).content == "over asyncio"
    import asyncio
    asyncio.run(by_asyncio())


def test_the_console_sees_every_node_through_the_one_url_it_was_given(
        unresolvable: Cluster) -> None:
    """`doq tui`'s cluster screen: the node it was given answers for itself (term, indexes);
    the others, whose advertised names do not resolve here, show as the leader sees them:
    up, with their roles, never "down"."""
    import asyncio

    from tests.tools.test_tui import rows, until
    from tui.app import ClusterScreen, DoqConsole, QueuesScreen

    follower = unresolvable.followers()[0]
    leader = unresolvable.leader()

    async def console() -> list[list[str]]:
        app = DoqConsole([f"http://127.0.0.1:{follower.http_port}"], refresh_every=0.5)
        async with app.run_test(size=(150, 30)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, QueuesScreen), what="queues")
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ClusterScreen), what="cluster")
            await until(pilot, lambda: len(rows(app, "#nodes")) == 3 and
                        all("up" in r[2] for r in rows(app, "#nodes")), 20, what="3 nodes up")
            seen = rows(app, "#nodes")
            await pilot.press("q")
            return seen

    seen = {r[0]: r for r in asyncio.run(console())}
    assert sorted(seen) == sorted(n.node_id for n in unresolvable.nodes)
    here = seen[follower.node_id]
    assert here[2] == "[green]up[/]" and here[3] != "–" and here[4] != "–", here
    assert "leader" in seen[leader.node_id][1] and "leader's view" in seen[leader.node_id][2]
    others = [r for k, r in seen.items() if k not in (follower.node_id, leader.node_id)]
    assert [r[1] for r in others] == ["follower"] and "leader's view" in others[0][2], seen


WORKER_TASKS = '''
from doq_lib.tasks import App

app = App({url!r})


@app.task(queue="given-work", name="note")
def note(n):
    with open({log!r}, "a") as f:
        f.write("%d\\n" % n)
'''


def test_a_worker_runs_tasks_with_only_the_url_it_was_given(unresolvable: Cluster,
                                                             tmp_path: Path) -> None:
    follower = unresolvable.followers()[0]
    url = f"http://127.0.0.1:{follower.http_port}"
    log = tmp_path / "ran"
    (tmp_path / "given_tasks.py").write_text(WORKER_TASKS.format(url=url, log=str(log)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.path.dirname(DOQ)])}
    worker = subprocess.Popen([sys.executable, DOQ, "worker", "given_tasks:app", "--queues",
                               "given-work", "--concurrency", "4"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sys.path.insert(0, str(tmp_path))
    try:
        import given_tasks  # noqa: PLC0415 - written above
        for n in range(10):
            given_tasks.note.send(n)
        wait_until(lambda: log.exists() and
                   sorted(log.read_text().split()) == sorted(str(n) for n in range(10)), 60,
                   describe=lambda: log.read_text() if log.exists() else "nothing ran")
    finally:
        sys.path.remove(str(tmp_path))
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
