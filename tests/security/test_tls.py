"""TLS: HTTPS and gRPC over TLS with a throwaway CA from ``doq certs``, mutual TLS
refusing clients without a certificate, and a 3-node cluster with TLS everywhere (and keys
and a cluster secret) through the cluster tests' core scenario, a join included."""
from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest

from doq_lib.client import connect
from doq_lib.errors import Unavailable
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.blocking_aio import KINDS, open_client
from tests.harness import DOQ, REPO, Cluster, Http, NodeProc, add_key, free_ports, wait_until

SECRET = "tls test cluster secret, 32 chars"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    done = subprocess.run([sys.executable, DOQ, "certs", f"--out={out}", "--hosts=node.test"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    for name in ("ca", "node", "client"):
        assert (out / f"{name}.pem").exists() and (out / f"{name}-key.pem").exists()
    assert oct((out / "node-key.pem").stat().st_mode & 0o777) == "0o600"
    return out


def client_context(certs: Path, with_certificate: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    if with_certificate:
        context.load_cert_chain(str(certs / "client.pem"), str(certs / "client-key.pem"))
    return context


def tls_flags(certs: Path, keys: Path) -> dict[str, str]:
    return {
        "http.tls_cert": str(certs / "node.pem"), "http.tls_key": str(certs / "node-key.pem"),
        "http.tls_client_ca": str(certs / "ca.pem"),
        "grpc.address": "127.0.0.1:0",
        "grpc.tls_cert": str(certs / "node.pem"), "grpc.tls_key": str(certs / "node-key.pem"),
        "grpc.tls_client_ca": str(certs / "ca.pem"),
        "cluster.tls_ca": str(certs / "ca.pem"),
        "raft.password": SECRET, "auth.keys_file": str(keys),
    }


@pytest.fixture(scope="module")
def cluster(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("tls")
    keys = root / "keys.yaml"
    admin = add_key(keys, "ops", "admin")
    c = Cluster(str(root), size=3, flags=tls_flags(certs, keys))
    for node in c.nodes:
        node.tls, node.admin_key = client_context(certs), admin
    try:
        yield c.start()
        c.assert_replicas_identical()
    finally:
        c.stop()


def _auth(node: NodeProc) -> dict[str, str]:
    return node.admin_headers()


def test_the_core_scenario_with_tls_everywhere(cluster: Cluster, certs: Path) -> None:
    leader = cluster.leader()
    assert [n.status()["raft"]["state"] for n in cluster.nodes].count("leader") == 1
    follower = cluster.followers()[0]
    http = follower.http()
    r = http.post("/API/v1/queues", {"name": "tls", "type": "delayed"}, headers=_auth(leader))
    assert r.status == 200, r.body
    ids = []
    for i in range(5):                                   # forwarded by the follower
        r = http.post("/API/v1/queues/tls/messages", {"content": f"m{i}", "priority": i},
                      headers=_auth(leader))
        assert r.status == 200, r.body
        ids.append(r.json()["id"])
    assert http.get("/API/v1/queues/tls", headers=_auth(leader)).json()["ready"] == 5
    r = leader.http().get("/API/v1/queues/tls/messages?ack=true", headers=_auth(leader))
    assert r.status == 200 and r.json()["id"] == ids[0]
    # The follower asks the leader for the lags: HTTPS between nodes, mutual TLS, signed
    # (once the members' identities, announced after start, have been replicated).
    def lags() -> bool:
        servers = http.get("/API/v1/cluster/servers", headers=_auth(leader)).json()["servers"]
        return len(servers) == 3 and all(s["lag"] is not None for s in servers)
    wait_until(lags, 20, describe=cluster.describe)
    cluster.assert_replicas_identical()


def test_long_poll_over_https_wakes_and_a_leaving_client_takes_nothing(
        cluster: Cluster, certs: Path) -> None:
    leader, follower = cluster.leader(), cluster.followers()[0]
    auth = _auth(leader)
    http = follower.http(timeout=30)
    assert http.post("/API/v1/queues", {"name": "tls-poll", "type": "delayed"},
                     headers=auth).status == 200
    answer: list[Any] = []
    waiter = threading.Thread(target=lambda: answer.append(follower.http(timeout=30).get(
        "/API/v1/queues/tls-poll/messages?count=5&wait=15&ack=true", headers=auth)))
    waiter.start()
    time.sleep(0.5)
    sent = leader.http().post("/API/v1/queues/tls-poll/messages",
                              {"content": "woken", "priority": 1}, headers=auth).json()["id"]
    waiter.join(20)
    assert answer and answer[0].status == 200, answer
    assert [m["id"] for m in answer[0].json()["messages"]] == [sent]
    # a TLS client that closes its connection while waiting takes nothing
    raw = socket.create_connection(("127.0.0.1", follower.http_port))
    tls = client_context(certs).wrap_socket(raw, server_hostname="localhost")
    tls.sendall(f"GET /API/v1/queues/tls-poll/messages?wait=10&ack=true HTTP/1.1\r\n"
                f"Host: localhost\r\nAuthorization: {auth['Authorization']}\r\n\r\n".encode())
    time.sleep(0.5)
    tls.close()
    time.sleep(0.3)
    kept = leader.http().post("/API/v1/queues/tls-poll/messages",
                              {"content": "kept", "priority": 1}, headers=auth).json()["id"]
    time.sleep(1.0)
    info = http.get("/API/v1/queues/tls-poll", headers=auth).json()
    assert (info["ready"], info["unacked"]) == (1, 0), info
    got = http.get("/API/v1/queues/tls-poll/messages?ack=true", headers=auth).json()
    assert got["id"] == kept


def test_a_node_joins_over_https(cluster: Cluster, certs: Path) -> None:
    leader = cluster.leader()
    http_port, raft_port = free_ports(2)
    flags = {**cluster.nodes[0].flags, "cluster.join_addr": f"127.0.0.1:{leader.http_port}"}
    flags.pop("cluster.peers", None)
    fourth = NodeProc("node-3", http_port, raft_port, cluster.nodes[0].data_dir, [], flags,
                      tls=client_context(certs), admin_key=cluster.nodes[0].admin_key)
    cluster.nodes.append(fourth)
    fourth.start()
    wait_until(fourth.ready, 40, describe=cluster.describe)
    servers = leader.http().get("/API/v1/cluster/servers",
                                headers=_auth(leader)).json()["servers"]
    assert {s["id"] for s in servers} == {"node-0", "node-1", "node-2", "node-3"}
    r = fourth.http().post("/API/v1/cluster/leave", {"id": "node-3"}, headers=_auth(leader))
    assert r.status == 200, r.body
    fourth.stop()
    cluster.nodes.remove(fourth)


def test_mutual_tls_refuses_a_client_without_a_certificate(cluster: Cluster,
                                                            certs: Path) -> None:
    node = cluster.nodes[0]
    anonymous = Http(node.http_port, tls=client_context(certs, with_certificate=False))
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        anonymous.get("/livez")
    with pytest.raises(OSError):                            # plain HTTP to the HTTPS port
        Http(node.http_port).get("/livez")
    untrusted = Http(node.http_port, tls=ssl.create_default_context())   # system CAs only
    with pytest.raises(ssl.SSLCertVerificationError):
        untrusted.get("/livez")
    assert node.http().get("/livez").status == 200


def test_bare_and_garbage_connections_cost_a_few_log_lines(certs: Path,
                                                          tmp_path: Path) -> None:
    """a TLS connection that never sent a ClientHello logged ~30 lines of
    traceback each (200 bare connects: 475 KB of log, no key needed). Each refused
    handshake is one line now, and a few a minute at most."""
    import socket
    import time

    keys = tmp_path / "keys.yaml"
    add_key(keys, "ops", "admin")
    flags = {**tls_flags(certs, keys), "http.header_timeout": "1"}
    c = Cluster(str(tmp_path), size=1, flags=flags)
    node = c.nodes[0]
    node.tls = client_context(certs)
    c.start()
    try:
        before = len(open(node.log_path, "rb").read())
        socks = []
        for n in range(200):
            sock = socket.create_connection(("127.0.0.1", node.http_port), timeout=10)
            if n % 2:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")   # not TLS
            socks.append(sock)
        time.sleep(2.5)                                  # every handshake timed out
        for sock in socks:
            sock.close()
        assert node.http().get("/livez").status == 200
        log = open(node.log_path, "rb").read()[before:].decode(errors="replace")
        assert "Traceback" not in log, log[:2000]
        lines = [line for line in log.splitlines() if "TLS handshake" in line]
        assert 1 <= len(lines) <= 12, len(lines)
        assert len(log) < 5000, len(log)
    finally:
        c.stop()


def test_grpc_over_tls_with_and_without_a_client_certificate(cluster: Cluster,
                                                             certs: Path) -> None:
    node = cluster.leader()
    target = node.status()["grpc_addr"]
    ca = (certs / "ca.pem").read_bytes()
    creds = grpc.ssl_channel_credentials(ca, (certs / "client-key.pem").read_bytes(),
                                         (certs / "client.pem").read_bytes())
    metadata = (("authorization", f"Bearer {node.admin_key}"),)
    with grpc.secure_channel(target, creds) as channel:
        stub = pb_grpc.DOQStub(channel)
        names = [q.name for q in stub.GetQueues(pb.GetQueuesRequest(), metadata=metadata,
                                                timeout=10).queues]
        assert "tls" in names
    _refused_without_a_certificate(target, ca, metadata)


def _refused_without_a_certificate(target: str, ca: bytes,
                                   metadata: tuple[tuple[str, str], ...]) -> None:
    """Over TLS without a client certificate (UNAVAILABLE: the handshake fails), and in
    plain text, a node under mutual TLS serves nothing, whatever key comes with the call."""
    with grpc.secure_channel(target, grpc.ssl_channel_credentials(ca)) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.DOQStub(channel).GetQueues(pb.GetQueuesRequest(), metadata=metadata,
                                               timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(target) as channel:
        with pytest.raises(grpc.RpcError):
            pb_grpc.DOQStub(channel).GetQueues(pb.GetQueuesRequest(), timeout=5)


def test_the_python_client_over_https_and_grpcs(cluster: Cluster, certs: Path) -> None:
    urls = [f"https://127.0.0.1:{n.http_port}" for n in cluster.nodes]
    files = {"ca_file": str(certs / "ca.pem"), "cert_file": str(certs / "client.pem"),
             "key_file": str(certs / "client-key.pem")}
    key = cluster.nodes[0].admin_key
    for transport in KINDS:                       # blocking and asyncio clients
        with open_client(urls, transport, api_key=key, **files) as client:
            message = client.enqueue("tls", f"via {transport}")
            assert client.get("tls", message.id).content == f"via {transport}"
    with pytest.raises(Unavailable):
        connect(urls, api_key=key, ca_file=str(certs / "ca.pem")).queues()  # no certificate
    with pytest.raises(Unavailable):
        open_client(urls, "http-async", api_key=key, ca_file=str(certs / "ca.pem")).queues()


def test_cli_backup_over_https(cluster: Cluster, certs: Path, tmp_path: Path) -> None:
    url = f"https://127.0.0.1:{cluster.nodes[1].http_port}"
    out = tmp_path / "full.bak"
    done = subprocess.run([sys.executable, DOQ, "backup", f"--url={url}", f"--output={out}",
                           f"--api-key={cluster.nodes[0].admin_key}",
                           f"--ca-file={certs / 'ca.pem'}", f"--cert-file={certs / 'client.pem'}",
                           f"--key-file={certs / 'client-key.pem'}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes().startswith(b"DOQBACKUP\n\x02"), "signed: the cluster has a secret"


def test_a_follower_relays_backups_over_tls_with_the_callers_key(cluster: Cluster) -> None:
    """A backup asked of a follower is relayed to the leader over the nodes' TLS with the
    caller's key, never the node's: the admin key gets the leader's signed backup, no key or
    a wrong one is refused (401), and a refused restore changes nothing."""
    follower = cluster.followers()[0]
    http = follower.http()
    backup = http.post("/db/backup", {"since": 0}, headers=follower.admin_headers())
    assert backup.status == 200 and backup.body.startswith(b"DOQBACKUP\n\x02"), backup.status
    assert backup.headers["x-last-version"].isdigit()
    anonymous = http.post("/db/backup", {"since": 0})
    assert anonymous.status == 401 and b"API key" in anonymous.body, anonymous.body
    wrong = http.post("/db/backup", {"since": 0}, headers={"Authorization": "Bearer nope"})
    assert wrong.status == 401, wrong.body
    before = cluster.leader().http().get("/API/v1/queues", headers=follower.admin_headers())
    refused = http.request("POST", "/db/restore", raw=backup.body,
                           headers={"Content-Type": "application/octet-stream"})
    assert refused.status == 401, refused.body
    after = cluster.leader().http().get("/API/v1/queues", headers=follower.admin_headers())
    assert after.body == before.body


def test_tls_settings_are_checked_at_start(tmp_path: Path, certs: Path) -> None:
    port, = free_ports(1)
    base = [sys.executable, DOQ, "serve", "--http.port=0", "--http.host=127.0.0.1",
            f"--raft.address=127.0.0.1:{port}", f"--storage.data_dir={tmp_path}"]
    for flags, message in (
            ([f"--http.tls_cert={certs / 'node.pem'}"], "give both http.tls_cert"),
            ([f"--http.tls_cert={certs / 'node.pem'}", "--http.tls_key=missing.pem"],
             "file not found"),
            ([f"--http.tls_cert={certs / 'ca.pem'}", f"--http.tls_key={certs / 'node-key.pem'}"],
             "cannot load the certificate")):
        done = subprocess.run(base + flags, capture_output=True, text=True, timeout=60,
                              cwd=str(tmp_path))
        assert done.returncode in (1, 2) and message in done.stderr, done.stderr


def test_plain_http_is_untouched(tmp_path: Path) -> None:
    """make run stays plain HTTP on localhost (no TLS settings: no TLS)."""
    c = Cluster(str(tmp_path), size=1).start()
    try:
        assert c.nodes[0].http().get("/livez").status == 200
        with socket.create_connection(("127.0.0.1", c.nodes[0].http_port), timeout=5) as s:
            s.sendall(b"GET /livez HTTP/1.0\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.1 200")
    finally:
        c.stop()
