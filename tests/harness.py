"""Test harness: real DOQ node processes on loopback, a tiny HTTP client, bounded waits."""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOQ = os.path.join(REPO, "doq.py")


# What the state machine logs when an operation fails inside it (doq_lib/fsm/machine.py).
STATE_MACHINE_FAILURE = re.compile(r"failed at entry \d+; rolled back|failed; isolating operations")


def free_ports(count: int) -> list[int]:
    socks, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A process's memory figure from /proc (KiB; 0 when it is not there): resident by
    default."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05,
               describe: Callable[[], str] | None = None) -> Any:
    """Poll until ``predicate()`` is truthy; on timeout fail with ``describe()``'s report."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception as exc:  # noqa: BLE001 - a node may be restarting
            value, last_error = None, exc
        else:
            last_error = None
        if value:
            return value
        if time.monotonic() >= deadline:
            report = describe() if describe else ""
            raise AssertionError(f"condition not met within {timeout}s "
                                 f"(last error: {last_error!r}) {report}")
        time.sleep(interval)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Http:
    """A keep-alive HTTP/1.1 client for one base address (stdlib only)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 15.0,
                 source: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.source = source                  # the client's own address (None: any)
        self.tls = tls                        # HTTPS with this context (None: plain HTTP)
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
                headers: dict[str, str] | None = None) -> Response:
        hdrs = dict(headers or {})
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        for attempt in range(2):
            conn = self._conn or self._connect()
            self._conn = conn
            try:
                conn.request(method, path, body=data, headers=hdrs)
                resp = conn.getresponse()
                payload = resp.read()
                return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()},
                                payload)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _connect(self) -> http.client.HTTPConnection:
        source = (self.source, 0) if self.source else None
        if self.tls is not None:
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                               source_address=source, context=self.tls)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout,
                                          source_address=source)

    def get(self, path: str, **kw: Any) -> Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Response:
        return self.request("POST", path, body, **kw)

    def put(self, path: str, body: Any = None, **kw: Any) -> Response:
        return self.request("PUT", path, body, **kw)

    def delete(self, path: str, **kw: Any) -> Response:
        return self.request("DELETE", path, **kw)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass
class NodeProc:
    node_id: str
    http_port: int
    raft_port: int
    data_dir: str
    peers: list[str]
    flags: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    host: str = "127.0.0.1"
    admin_key: str | None = None      # sent to /internal/* when the node has a keys file
    tls: ssl.SSLContext | None = None  # the tests' client context when the node serves HTTPS

    @property
    def raft_addr(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def log_path(self) -> str:
        return os.path.join(self.data_dir, f"{self.node_id}.log")

    def args(self) -> list[str]:
        flags = {
            "cluster.node_id": self.node_id, "http.port": str(self.http_port),
            "http.host": self.host, "raft.address": self.raft_addr,
            "storage.data_dir": self.data_dir, "prometheus.enabled": "true",
            "logging.level": "info",
        }
        if self.peers:
            flags["cluster.peers"] = ",".join(self.peers)
        flags.update(self.flags)
        return [sys.executable, DOQ, "serve"] + [f"--{k}={v}" for k, v in flags.items()]

    def start(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        env = {**os.environ, **self.env}
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args(), cwd=self.data_dir, stdout=log, stderr=log,
                                     env=env)
        log.close()
        self.starts += 1

    def http(self, timeout: float = 15.0) -> Http:
        return Http(self.http_port, host=self.host, timeout=timeout, tls=self.tls)

    def gauge(self, name: str) -> float:
        """An unlabelled metric's value from /metrics (NaN when the node does not show it)."""
        for line in self.http().get("/metrics").body.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return float("nan")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        self.check_log()

    def check_log(self) -> None:
        """A failure inside the state machine is a bug (bad input must be refused before it
        is proposed): fail the test that saw one, unless the node injects faults on purpose."""
        if self.env.get("DOQ_FAULTS_ENABLED") == "1":
            return
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return
        found = [line for line in lines if STATE_MACHINE_FAILURE.search(line)]
        assert not found, (f"{self.node_id}: the state machine failed on an operation "
                           f"(input the transports should have refused?):\n" +
                           "\n".join(found[:5]))

    def signal(self, sig: int) -> None:
        """Send ``sig`` without waiting for the process to end (SIGSTOP, SIGCONT)."""
        assert self.proc is not None and self.alive()
        self.proc.send_signal(sig)

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}

    def status(self) -> dict[str, Any]:
        return self.http(timeout=3).get("/internal/status", headers=self.admin_headers()).json()

    def state(self) -> dict[str, Any]:
        return self.http(timeout=10).get("/internal/state", headers=self.admin_headers()).json()

    def ready(self) -> bool:
        try:
            return self.http(timeout=2).get("/readyz").status == 200
        except OSError:
            return False

    def tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""


class Cluster:
    def __init__(self, root: str, size: int = 3, flags: dict[str, str] | None = None,
                 env: dict[str, str] | None = None, hosts: list[str] | None = None) -> None:
        hosts = hosts or ["127.0.0.1"] * size
        ports = free_ports(2 * size)
        raft_ports, http_ports = ports[:size], ports[size:]
        peers = [f"{hosts[i]}:{raft_ports[i]}" for i in range(size)] if size > 1 else []
        self.nodes = [NodeProc(f"node-{i}", http_ports[i], raft_ports[i], root, peers,
                               dict(flags or {}), dict(env or {}), host=hosts[i])
                      for i in range(size)]

    def start(self, timeout: float = 30.0) -> "Cluster":
        for node in self.nodes:
            node.start()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_until(lambda: all(n.ready() for n in self.nodes if n.alive()), timeout,
                   describe=self.describe)

    def leader(self, timeout: float = 20.0) -> NodeProc:
        def find() -> NodeProc | None:
            for node in self.nodes:
                if node.alive() and node.status()["raft"]["state"] == "leader":
                    return node
            return None
        return wait_until(find, timeout, describe=self.describe)  # type: ignore[no-any-return]

    def followers(self) -> list[NodeProc]:
        leader = self.leader()
        return [n for n in self.nodes if n is not leader and n.alive()]

    def describe(self) -> str:
        parts = []
        for node in self.nodes:
            try:
                info = json.dumps(node.status()["raft"]) if node.alive() else "down"
            except Exception as exc:  # noqa: BLE001
                info = f"unreachable: {exc!r}"
            parts.append(f"\n--- {node.node_id} (http {node.http_port}): {info}\n{node.tail(8)}")
        return "".join(parts)

    def states(self) -> list[dict[str, Any]]:
        return [n.state() for n in self.nodes if n.alive()]

    def assert_replicas_identical(self, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Wait until every live replica applied the same index, then compare digests."""
        def converged() -> list[dict[str, Any]] | None:
            states = self.states()
            indexes = {s["applied_index"] for s in states}
            return states if len(indexes) == 1 else None
        states = wait_until(converged, timeout, describe=self.describe)
        digests = {s["node_id"]: s["digest"] for s in states}
        assert len(set(digests.values())) == 1, f"replicas diverged: {digests}"
        # Durability: no node ever acknowledged an entry before its journal held it on disk.
        unsynced = {n.node_id: n.status()["raft"]["acks_unsynced"] for n in self.nodes
                    if n.alive()}
        assert not any(unsynced.values()), f"acks sent for unsynced entries: {unsynced}"
        return states  # type: ignore[no-any-return]

    def stop(self) -> None:
        for node in self.nodes:
            try:
                node.kill(signal.SIGTERM)
            except subprocess.TimeoutExpired:
                node.kill()
        for node in self.nodes:
            node.check_log()

    def kill_all(self) -> None:
        for node in self.nodes:
            node.kill()


@contextlib.contextmanager
def running(root: str, size: int = 1, flags: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A started cluster of ``size`` nodes under ``root``, stopped on leaving the block."""
    c = Cluster(root, size=size, flags=flags).start()
    try:
        yield c
    finally:
        c.stop()


#: The fault-injection files of a node (the faults.* configuration keys, set through their
#: environment variables) -> the file's suffix beside the node's log.
FAULT_FILES = {"DOQ_FAULTS_CLOCK_OFFSET_FILE": "clock-offset",
               "DOQ_FAULTS_FAIL_FSYNC_FILE": "fail-fsync",
               "DOQ_FAULTS_FAIL_WRITE_FILE": "fail-write"}


def fault_file(node: NodeProc, variable: str) -> str:
    return os.path.join(node.data_dir, f"{node.node_id}.{FAULT_FILES[variable]}")


@contextlib.contextmanager
def injectable(root: str, size: int = 3, flags: dict[str, str] | None = None
               ) -> Iterator[Cluster]:
    """A started cluster whose nodes take injected faults (DOQ_FAULTS_ENABLED=1 and each
    node's :data:`FAULT_FILES`), stopped on leaving the block."""
    c = Cluster(root, size=size, flags=flags, env={"DOQ_FAULTS_ENABLED": "1"})
    for node in c.nodes:
        for variable in FAULT_FILES:
            node.env[variable] = fault_file(node, variable)
    c.start()
    try:
        yield c
    finally:
        c.stop()


class FakeRaftPeer:
    """Something that answers DOQ's Raft handshake on loopback and then ignores everything:
    a member-to-be that never acknowledges (``secret``: the passphrase it proves)."""

    def __init__(self, secret: str | None = None) -> None:
        import threading

        from doq_lib.raft import wire
        from doq_lib.secret import ClusterSecret

        self._wire = wire
        self.security = wire.WireSecurity(ClusterSecret(secret).key("raft") if secret else None)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.handshakes = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import threading

        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        wire = self._wire
        try:
            conn.settimeout(30)
            hello = b""
            while len(hello) < wire.HELLO.size:
                more = conn.recv(wire.HELLO.size - len(hello))
                if not more:
                    return
                hello += more
            _, _, nonce_c, cluster_c = wire.HELLO.unpack(hello)
            nonce_s = os.urandom(wire.NONCE)
            proof = self.security.proof(b"doq-raft server", nonce_c, nonce_s,
                                        cluster_c + wire.NO_CLUSTER)
            conn.sendall(wire.REPLY.pack(wire.MAGIC, self.security.flags, nonce_s,
                                         wire.NO_CLUSTER, proof))
            self.handshakes += 1
            while not self._stop and conn.recv(65536):
                pass
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def add_key(keys_file: Any, name: str, role: str, queues: str = "") -> str:
    """``doq keys add`` into ``keys_file``; returns the key it printed (shown once)."""
    args = [sys.executable, DOQ, "keys", "add", f"--keys-file={keys_file}", f"--name={name}",
            f"--role={role}"] + ([f"--queues={queues}"] if queues else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "shown once" in done.stderr
    return done.stdout.strip()


def message_body(content: str, priority: int, group: str = "",
                 metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """An enqueue request body; group and metadata only when given."""
    body: dict[str, Any] = {"content": content, "priority": priority}
    if group:
        body["group"] = group
    if metadata:
        body["metadata"] = metadata
    return body


def fill_disk(directory: str, left: int) -> str:
    """Take all but ``left`` bytes of the file system of ``directory`` with a file (never
    all: a node writes there too); returns its path, to remove when done."""
    st = os.statvfs(directory)
    size = max(0, st.f_bavail * st.f_frsize - left)
    path = os.path.join(directory, "filler")
    with open(path, "wb") as f:
        while size > 0:
            size -= f.write(b"\0" * min(size, 1 << 20))
    return path
