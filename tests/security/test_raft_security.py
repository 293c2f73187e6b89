"""The Raft port: nothing unpickled into objects, peers authenticated before any
command is read, and no Raft port reachable from other machines without a cluster secret."""
from __future__ import annotations

import os
import pickle
import socket
import struct
import subprocess
import sys
import zlib
from typing import Any

import pytest

from doq_lib.raft import wire
from doq_lib.secret import ClusterSecret
from tests.harness import DOQ, REPO, Cluster, NodeProc, free_ports, wait_until

SECRET = "correct horse battery staple 42"
OTHER = "a different secret, also long"


class Exploit:
    """Pickles to a call of exec(): what an attacker sends to a pickle-reading port."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        code = f"open({self.marker!r}, 'w').write(str(__import__('os').getpid()))"
        return exec, (code,)


def _legacy_frame(obj: Any) -> bytes:
    """PySyncObj's own framing: native int length, zlib-compressed protocol-2 pickle."""
    data = zlib.compress(pickle.dumps(obj, protocol=2), 3)
    return struct.pack("i", len(data)) + data


# -- the codec, in process ---------------------------------------------------------------------
def test_frames_decode_plain_data_and_refuse_every_global(tmp_path: Any) -> None:
    plain = {"type": "append_entries", "term": 3, "entries": [(b"\x00cmd", 4, 3)],
             "flags": {1, 2}, "ratio": 0.5, "none": None, "frozen": frozenset({"a"})}
    assert wire.loads_frame(wire.dumps(plain)) == plain
    marker = str(tmp_path / "pwned")
    with pytest.raises(wire.UnsafePayload, match=r"\.exec: only plain data"):
        wire.loads_frame(pickle.dumps(Exploit(marker), protocol=2))
    with pytest.raises(wire.UnsafePayload):
        wire.loads_frame(pickle.dumps(os.system))
    assert not os.path.exists(marker)


def test_commands_may_hold_node_objects_and_nothing_else(tmp_path: Any) -> None:
    import pysyncobj.pickle as ps_pickle
    from pysyncobj.node import TCPNode

    wire.install()
    change = ["add", "127.0.0.1:9001", TCPNode("127.0.0.1:9001")]
    decoded = ps_pickle.loads(pickle.dumps(change, protocol=5))
    assert decoded[2] == TCPNode("127.0.0.1:9001") and decoded[2].port == 9001
    with pytest.raises(wire.UnsafePayload):
        wire.loads_frame(pickle.dumps(change, protocol=5))     # never in a frame
    marker = str(tmp_path / "pwned")
    with pytest.raises(wire.UnsafePayload):                      # what a journal entry could hold
        ps_pickle.loads(pickle.dumps((1, (Exploit(marker),))))
    assert not os.path.exists(marker)


# -- a peer on the wire --------------------------------------------------------------------------
class Peer:
    """A hand-made Raft peer: the real handshake with a chosen secret (or none)."""

    def __init__(self, address: str, secret: str | None, cluster_id: str = "") -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        key = ClusterSecret(secret).key("raft") if secret else None
        self.security = wire.WireSecurity(key, lambda: cluster_id)
        self.seal: Any = None
        self.sent = 0

    def handshake(self) -> bool:
        """True if the node accepted the handshake."""
        nonce_c = os.urandom(wire.NONCE)
        cluster_c = self.security.cluster()
        self.sock.sendall(wire.HELLO.pack(wire.MAGIC, self.security.flags, nonce_c,
                                          cluster_c))
        try:
            reply = self._recv(wire.REPLY.size)
        except OSError:
            return False
        if reply is None:
            return False
        _, _, nonce_s, cluster_s, _ = wire.REPLY.unpack(reply)
        if self.security.key:
            self.sock.sendall(self.security.proof(b"doq-raft client", nonce_c, nonce_s,
                                                  cluster_c + cluster_s))
        self.seal, _ = self.security.session(nonce_c, nonce_s, outgoing=True)
        return True

    def frame(self, message: Any, raw: bytes | None = None) -> bytes:
        body = raw if raw is not None else wire.dumps(message)
        if self.seal is not None:
            body = self.seal.encrypt(self.sent.to_bytes(12, "big"), body, None)
            self.sent += 1
        return wire.LENGTH.pack(len(body)) + body

    def send(self, message: Any, raw: bytes | None = None) -> None:
        self.sock.sendall(self.frame(message, raw))

    def closed_by_node(self, timeout: float = 5.0) -> bool:
        """Whether the node closes the connection (reading and discarding what it sends)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def _recv(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            more = self.sock.recv(size - len(data))
            if not more:
                return None
            data += more
        return data

    def close(self) -> None:
        self.sock.close()


def _write_works(node: NodeProc, queue: str) -> None:
    http = node.http()
    assert http.post("/API/v1/queues", {"name": queue, "type": "delayed"}).status == 200
    r = http.post(f"/API/v1/queues/{queue}/messages", {"content": "still fine", "priority": 1})
    assert r.status == 200, r.body


@pytest.fixture(scope="module")
def open_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two nodes on loopback without a secret (allowed there)."""
    c = Cluster(str(tmp_path_factory.mktemp("open")), size=2).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def secret_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    c = Cluster(str(tmp_path_factory.mktemp("secret")), size=3,
                flags={"raft.password": SECRET}).start()
    yield c
    c.stop()


@pytest.mark.parametrize("framing", ["legacy", "after-handshake", "after-naming-a-member"])
def test_the_pickle_exploit_runs_nothing_on_a_node_without_secret(
        open_cluster: Cluster, tmp_path: Any, framing: str) -> None:
    marker = str(tmp_path / "pwned")
    # Pose as the member that calls the target (PySyncObj connects from the greater address).
    target, other = sorted(open_cluster.nodes, key=lambda n: n.raft_addr)
    before = target.state()["queue_digest"]
    peer = Peer(target.raft_addr, None)
    try:
        if framing == "legacy":
            peer.sock.sendall(_legacy_frame(Exploit(marker)) + b"\0" * 64)
        else:
            assert peer.handshake()
            frames = peer.frame(other.raft_addr) if framing == "after-naming-a-member" else b""
            exploit = peer.frame(None, raw=pickle.dumps(Exploit(marker), protocol=2))
            peer.sock.sendall(frames + exploit)       # one write: read in one go
        assert peer.closed_by_node()
    finally:
        peer.close()
    assert not os.path.exists(marker)
    open_cluster.wait_ready()
    assert target.alive()
    assert target.state()["queue_digest"] == before
    _write_works(open_cluster.leader(), f"after-{framing}")
    expected = "does not speak DOQ" if framing == "legacy" else "refused to load"
    assert expected in target.tail(50)


def test_the_pickle_exploit_runs_nothing_on_a_node_with_a_secret(
        secret_cluster: Cluster, tmp_path: Any) -> None:
    node = secret_cluster.nodes[0]
    marker = str(tmp_path / "pwned")
    before = node.state()["queue_digest"]
    for attempt in (_legacy_frame(Exploit(marker)), pickle.dumps(Exploit(marker))):
        peer = Peer(node.raft_addr, None)
        try:
            peer.sock.sendall(attempt + b"\0" * 128)
            assert peer.closed_by_node()
        finally:
            peer.close()
    assert not os.path.exists(marker)
    secret_cluster.wait_ready()
    assert node.state()["queue_digest"] == before
    _write_works(secret_cluster.leader(), "exploit-with-secret")


@pytest.mark.parametrize("secret", [None, OTHER])
def test_a_peer_without_the_secret_cannot_vote_or_append(
        secret_cluster: Cluster, secret: str | None) -> None:
    leader = secret_cluster.leader()
    term = leader.status()["raft"]["term"]
    follower = next(n for n in secret_cluster.nodes if n is not leader)
    peer = Peer(follower.raft_addr, secret)
    try:
        accepted = peer.handshake()
        if accepted:                 # the proof is checked when it arrives: then it closes
            try:
                peer.send(leader.raft_addr)
                peer.send({"type": "request_vote", "term": term + 100,
                           "last_log_index": 10 ** 9, "last_log_term": term + 100})
                peer.send({"type": "append_entries", "term": term + 100, "commit_index": 0})
            except OSError:
                pass
        assert peer.closed_by_node()
    finally:
        peer.close()
    assert secret_cluster.leader() is leader
    assert leader.status()["raft"]["term"] == term, "an outsider's vote request counted"
    assert "refused a connection" in follower.tail(80)
    _write_works(leader, f"outsider-{secret is None}")


def test_readonly_observers_and_strangers_are_refused(open_cluster: Cluster) -> None:
    for name in ("readonly", "127.0.0.1:1", ["status"]):
        peer = Peer(open_cluster.nodes[0].raft_addr, None)
        try:
            assert peer.handshake()
            peer.send(name)              # PySyncObj streamed the whole log to "readonly"
            assert peer.closed_by_node()
        finally:
            peer.close()
    assert "not as a member" in open_cluster.nodes[0].tail(50)
    low, high = sorted(open_cluster.nodes, key=lambda n: n.raft_addr)
    peer = Peer(high.raft_addr, None)      # "high" calls "low" itself: "low" never calls in
    try:
        assert peer.handshake()
        peer.send(low.raft_addr)
        assert peer.closed_by_node()
    finally:
        peer.close()
    assert "a member this node calls itself" in high.tail(50)
    open_cluster.wait_ready()


@pytest.mark.parametrize("cluster", ["secret", "open"])
def test_a_peer_presenting_another_clusters_id_is_refused_in_the_handshake(
        secret_cluster: Cluster, open_cluster: Cluster, cluster: str) -> None:
    """the handshake carries the cluster's id (with a secret, under its HMAC); a
    peer that knows another id is refused before anything it sends is read, one that
    knows none yet (a new member, a wiped disk) or the same one is served."""
    c = secret_cluster if cluster == "secret" else open_cluster
    secret = SECRET if cluster == "secret" else None
    wait_until(lambda: c.nodes[0].status()["cluster_id"], 20)
    ours = c.nodes[0].status()["cluster_id"]
    node = sorted(c.nodes, key=lambda n: n.raft_addr)[0]
    for theirs, served in (("ab" * 16, False), ("", True), (ours, True)):
        peer = Peer(node.raft_addr, secret, theirs)
        try:
            assert peer.handshake() is served
            if served:
                assert not peer.closed_by_node(timeout=1.0)
            else:
                assert peer.closed_by_node()
        finally:
            peer.close()
    assert "belongs to another cluster" in node.tail(80)
    c.wait_ready()


def test_a_node_with_another_secret_never_joins_the_cluster(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    c = Cluster(str(tmp_path_factory.mktemp("outsider")), size=3,
                flags={"raft.password": SECRET})
    outsider = c.nodes[2]
    outsider.flags["raft.password"] = OTHER             # same peers, another secret
    for node in c.nodes:
        node.start()
    try:
        wait_until(lambda: all(n.ready() for n in c.nodes[:2]), 30, describe=c.describe)
        leader = c.leader()
        assert leader is not outsider
        _write_works(leader, "sec")
        status = outsider.status()["raft"]
        assert status["state"] != "leader" and status["leader"] is None
        assert not outsider.ready()
        assert "sec" not in outsider.http().get("/API/v1/queues").body.decode()
        assert "does not know the cluster secret" in outsider.tail(100) + leader.tail(100)
    finally:
        c.stop()


def test_the_secret_can_come_from_a_file(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("file")
    secret_file = root / "secret"
    secret_file.write_text(SECRET + "\n")
    c = Cluster(str(root), size=2, flags={"raft.password_file": str(secret_file)}).start()
    try:
        _write_works(c.leader(), "from-file")
        c.assert_replicas_identical()
    finally:
        c.stop()


# -- refusing to start ---------------------------------------------------------------------------
def _serve(tmp_path: Any, *flags: str, env: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    http_port, = free_ports(1)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("DOQ_RAFT")}
    return subprocess.run([sys.executable, DOQ, "serve", f"--http.port={http_port}",
                           "--http.host=127.0.0.1", f"--storage.data_dir={tmp_path}", *flags],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=60,
                          env={**environment, **(env or {})})


@pytest.mark.parametrize("address", ["0.0.0.0:{port}", ":{port}", "doq-0.example:{port}",
                                     "[::]:{port}"])
def test_raft_on_a_reachable_address_without_a_secret_refuses_to_start(
        tmp_path: Any, address: str) -> None:
    port, = free_ports(1)
    result = _serve(tmp_path, f"--raft.address={address.format(port=port)}")
    assert result.returncode == 2, result.stderr
    assert "without a cluster secret" in result.stderr
    assert "raft.password" in result.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--raft.password=short"], "at least 16 characters"),
    (["--raft.password_file=missing.txt"], "cannot read raft.password_file"),
    (["--raft.password=" + SECRET, "--raft.password_file=x"], "not both"),
])
def test_unusable_secrets_are_refused(tmp_path: Any, flags: list[str], message: str) -> None:
    port, = free_ports(1)
    result = _serve(tmp_path, f"--raft.address=127.0.0.1:{port}", *flags)
    assert result.returncode == 2
    assert message in result.stderr


def test_a_reachable_bind_with_a_secret_from_the_environment_starts(tmp_path: Any) -> None:
    port, = free_ports(1)
    node = subprocess.Popen(
        [sys.executable, DOQ, "serve", "--http.port=0", "--http.host=127.0.0.1",
         f"--raft.address=127.0.0.1:{port}", f"--raft.bind_address=0.0.0.0:{port}",
         f"--storage.data_dir={tmp_path}", "--logging.level=info"], cwd=REPO,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "DOQ_RAFT_PASSWORD": SECRET})
    try:
        assert node.stderr is not None
        line = node.stderr.readline()
        assert "serving HTTP" in line, line
    finally:
        node.terminate()
        node.wait(timeout=20)


def test_refusals_are_logged_once_a_minute_per_host_and_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    security = wire.WireSecurity(None)
    with caplog.at_level("WARNING", logger="doq_lib.raft.wire"):
        for port in range(40000, 40050):          # a client reconnecting from new ports
            security.refuse(f"10.0.0.9:{port}", "it does not speak DOQ's Raft protocol")
        security.refuse("10.0.0.9:1", "the peer does not know the cluster secret")
        security.refuse("10.0.0.8:1", "it does not speak DOQ's Raft protocol")
    assert security.refused == 52
    assert len(caplog.records) == 3


def test_a_member_not_yet_applied_is_refused_at_info_for_a_while(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a join is applied, members and the joiner refuse each other's connections until
    they have the change: at INFO for JOIN_GRACE seconds of one address, then warned."""
    clock = [1000.0]
    monkeypatch.setattr(wire.time, "monotonic", lambda: clock[0])

    class Transport:
        _joining = wire.WireTransport._joining

        def __init__(self) -> None:
            self._strangers: dict[str, float] = {}

    transport, security = Transport(), wire.WireSecurity(None)
    with caplog.at_level("INFO", logger="doq_lib.raft.wire"):
        assert transport._joining("10.0.0.4:4321")
        security.refuse("10.0.0.4:5000", "not a member (yet)", expected=True)
        clock[0] += wire.JOIN_GRACE - 0.1
        assert transport._joining("10.0.0.4:4321") and transport._joining("10.0.0.5:4321")
        clock[0] += 0.2
        assert not transport._joining("10.0.0.4:4321")
        assert transport._joining("10.0.0.5:4321")
        security.refuse("10.0.0.4:5001", "not a member")
    assert [r.levelname for r in caplog.records] == ["INFO", "WARNING"]
    assert security.refused == 2
    for n in range(3000):                     # bounded, however many strangers call
        transport._joining(f"10.1.{n // 256}.{n % 256}:1")
    assert len(transport._strangers) <= 1001
