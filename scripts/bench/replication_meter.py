#!/usr/bin/env python3
"""A meter for the replicated path whose figures do not move with the machine's speed.

    python scripts/bench/replication_meter.py [-n 300] [--workloads enqueue-leader,...]
                                              [--calls] [--callgrind] [--repo DIR]

Three whole DOQ nodes (server.Node: HTTP server, service, proposer, Raft, LMDB) run in this
one gevent process on loopback, and a client drives a fixed, sequential workload over real
HTTP and gRPC connections:

  enqueue-leader    ``-n`` single enqueues (256-byte content) to the leader;
  enqueue-follower  the same to a follower, which forwards them;
  consume-ack       ``-n`` dequeues (``ack=false``) and acks, both to the leader;
  grpc-...          the same three over gRPC's unary Enqueue, Dequeue and Ack;
  grpc-stream-...   ``-n`` enqueues on one EnqueueStream, each answer awaited before the next
                    request (as the shared harness's producers do), to the leader or a
                    follower.

The client runs in a process of its own (started and connected before each measurement), one
request at a time, so each write is one Raft entry and the counts repeat run after run. For
each workload, per message, counted in the cluster's process (all three nodes together):

  entries      Raft log entries committed;
  frames       Raft messages sent between the nodes;
  switches     greenlet switches;
  cpu_us       CPU time (drifts with the machine: compare only within one run), and
               ``hub_cpu_us``, the part of it in the event loop's thread (the rest: the
               gRPC threads, the apply and sync threads);
  syscalls     system calls (``perf stat -e raw_syscalls:sys_enter``, where perf can);
  instr        with ``--callgrind``: instructions counted by valgrind's callgrind, the
               repeatable figure (the script runs itself under valgrind; about 50 times
               slower). The timers of an idle cluster are measured first and their share over
               the workload's wall time is taken off (``instr`` is net, ``instr_raw`` is not);
  calls        with ``--calls``: Python function calls and C calls (``sys.setprofile``),
               with the C calls that matter named: pickles, LMDB transactions, socket
               sends and receives, fsyncs, cross-thread wake-ups; and the busiest functions.

``--repo DIR`` runs another checkout's doq_lib (the code before a change) under this script.
Bounded by ``-n`` and ``--max-seconds`` per workload; loopback only.
"""
from __future__ import annotations

import sys

from gevent import monkey

if "--client" not in sys.argv:          # the client process blocks in grpcio's calls
    monkey.patch_all()

import argparse  # noqa: E402
import collections  # noqa: E402
import cProfile  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any, Callable, Iterator  # noqa: E402

import gevent  # noqa: E402
import greenlet  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKLOADS = ("enqueue-leader", "enqueue-follower", "consume-ack", "grpc-enqueue-leader",
             "grpc-enqueue-follower", "grpc-consume-ack", "grpc-stream-leader",
             "grpc-stream-follower")
# Timers slow enough that an idle cluster costs little next to the workload, even under
# valgrind; the same in every mode, so the modes' counts compare. Only the first election
# waits longer under valgrind (which runs about 50 times slower).
RAFT_TIMING = {"raft.append_entries_period": "1.0", "raft.leader_fallback_timeout": "60",
               "raft.tick_period": "1.0", "raft.apply_timeout": "120"}
ELECTION = {"raft.election_timeout_min": "3.5", "raft.election_timeout_max": "6"}
ELECTION_UNDER_VALGRIND = {"raft.election_timeout_min": "8", "raft.election_timeout_max": "16"}
# Calls counted by name under --calls: C calls as type-or-module.name, Python functions as
# file:name.
NAMED = {
    "pickle": ("_pickle.dumps", "_pickle.loads", "Pickler.dump", "Unpickler.load"),
    "lmdb_txn": ("Environment.begin",),
    "sock_send": ("_wrefsocket.send", "_wrefsocket.sendall", "SSLSocket.send"),
    "sock_recv": ("_wrefsocket.recv", "_wrefsocket.recv_into"),
    "syncs": ("aio.py:submit", "posix.fsync", "posix.fdatasync"),
    "thread_wakeups": ("async_.send", "base_events.py:call_soon_threadsafe"),
}


TICKS = os.sysconf("SC_CLK_TCK")


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def spawn(argv: list[str], stderr_path: str | None = None) -> int:
    """Start ``argv`` without fork(): grpcio's threads are running, and a forked child runs
    grpcio's fork handlers (or skips them) before its exec. Returns the pid."""
    actions: list[Any] = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
    if stderr_path:
        actions.append((os.POSIX_SPAWN_OPEN, 2, stderr_path, os.O_WRONLY | os.O_CREAT, 0o600))
    return os.posix_spawnp(argv[0], argv, dict(os.environ), file_actions=actions)


def finish(pid: int) -> int:
    """Wait for a spawned process (cooperatively: gevent's os.waitpid); its exit status."""
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def thread_cpu() -> dict[int, float]:
    """CPU seconds of each of this process's OS threads, by thread id."""
    out = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue                                      # the thread ended
        out[int(task)] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


class Switches:
    """Counts greenlet switches (greenlet.settrace)."""

    def __init__(self) -> None:
        self.count = 0
        greenlet.settrace(self._trace)

    def _trace(self, event: str, args: Any) -> None:
        if event in ("switch", "throw"):
            self.count += 1


class Frames:
    """Counts Raft messages sent, by wrapping the wire's send."""

    def __init__(self, connection_class: Any) -> None:
        self.count = 0
        original = connection_class.send

        def send(conn: Any, message: Any) -> None:
            self.count += 1
            original(conn, message)
        connection_class.send = send


class Calls:
    """Python and C calls while on (sys.setprofile on every thread)."""

    def __init__(self) -> None:
        self.python: collections.Counter[str] = collections.Counter()
        self.c: collections.Counter[str] = collections.Counter()

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            self.python[f"{os.path.basename(code.co_filename)}:{code.co_name}"] += 1
        elif event == "c_call":
            owner = getattr(arg, "__self__", None)
            if owner is None or isinstance(owner, type(sys)):
                where = getattr(arg, "__module__", None) or getattr(owner, "__name__", "?")
            else:
                where = type(owner).__name__
            self.c[f"{where}.{arg.__name__}"] += 1

    def start(self) -> None:
        self.python.clear()
        self.c.clear()
        import threading
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)

    def stop(self) -> None:
        import threading
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def report(self, per: int) -> dict[str, Any]:
        named = {k: round(sum(self.c[n] + self.python[n] for n in names) / per, 2)
                 for k, names in NAMED.items()}
        return {"py_calls": round(sum(self.python.values()) / per, 1),
                "c_calls": round(sum(self.c.values()) / per, 1), **named,
                "top_py": [(k, round(v / per, 2)) for k, v in self.python.most_common(25)],
                "top_c": [(k, round(v / per, 2)) for k, v in self.c.most_common(15)]}


class Syscalls:
    """System calls of this process while on, through perf (None where perf cannot)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.usable = shutil.which("perf") is not None
        self.out = tempfile.mktemp(prefix="doq-meter-perf-")

    def start(self) -> None:
        if not self.usable:
            return
        self.pid = spawn(["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p",
                          str(os.getpid())], self.out)
        gevent.sleep(0.5)                                 # perf attaches

    def stop(self) -> int | None:
        if self.pid is None:
            return None
        os.kill(self.pid, signal.SIGINT)
        finish(self.pid)
        self.pid = None
        with open(self.out, errors="replace") as f:
            err = f.read()
        os.unlink(self.out)
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and "raw_syscalls" in fields[2] and fields[0].isdigit():
                return int(fields[0])
        sys.stderr.write(f"perf counted no system calls: {err[-300:]}\n")
        self.usable = False                               # not supported here
        return None


class Callgrind:
    """Zeroes and dumps callgrind's counters around each measurement (under valgrind)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.dumps = 0

    def zero(self) -> None:
        if finish(spawn(["callgrind_control", "-z", str(os.getpid())])):
            raise SystemExit("callgrind_control -z failed")

    def dump(self) -> int:
        self.dumps += 1
        label = f"m{self.dumps}"
        if finish(spawn(["callgrind_control", "-d", label, str(os.getpid())])):
            raise SystemExit("callgrind_control -d failed")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for path in glob.glob(os.path.join(self.out_dir, "cg.out*")):
                with open(path, errors="replace") as f:
                    text = f.read()
                if f"Trigger: dump {label}" in text:
                    for line in text.splitlines():
                        if line.startswith("summary:") or line.startswith("totals:"):
                            return int(line.split()[1])
            gevent.sleep(0.1)
        raise SystemExit("callgrind did not write its dump")


class Client:
    """One keep-alive HTTP/1.1 connection, as lean as it can be: requests built by hand."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        self.sock.sendall(head.encode() + body)
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head_bytes, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(v) for k, _, v in (h.partition(":") for h in lines[1:])
                      if k.strip().lower() == "content-length")
        while len(self.buf) < length:
            self._more()
        payload, self.buf = self.buf[:length], self.buf[length:]
        return status, payload

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise SystemExit("the node closed the connection")
        self.buf += chunk


def by_file(profile: cProfile.Profile) -> list[tuple[str, float]]:
    """The share of the profiled time spent in each source file's own code (C calls are
    put with the file that made them), biggest first."""
    own: collections.Counter[str] = collections.Counter()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    for (path, _, _), (_, _, tottime, _, callers) in stats.items():
        if path == "~" and callers:                       # a C call: to its busiest caller
            caller = max(callers.items(), key=lambda kv: kv[1][2])[0]
            path = caller[0]
        parts = path.replace(os.sep, "/").split("/")
        label = "/".join(parts[-2:]) if parts[-2:-1] != ["site-packages"] else parts[-1]
        own[label] += tottime
    total = sum(own.values()) or 1.0
    return [(k, round(100 * v / total, 1)) for k, v in own.most_common(30)]


def revision(repo: str) -> str:
    done = subprocess.run(["git", "-C", repo, "describe", "--always", "--dirty"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


def start_cluster(root: str, election: dict[str, str]) -> list[Any]:
    from doq_lib.config import load_config
    from doq_lib.server import Node

    held = []                       # the Raft ports, distinct (HTTP and gRPC bind port 0)
    for _ in range(3):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        held.append(s)
    peers = [f"127.0.0.1:{s.getsockname()[1]}" for s in held]
    for s in held:
        s.close()
    nodes = []
    for i in range(3):
        flags = {"cluster.node_id": f"n{i}", "raft.address": peers[i],
                 "cluster.peers": ",".join(peers), "storage.data_dir": root,
                 "http.host": "127.0.0.1", "http.port": "0",
                 "grpc.address": "127.0.0.1:0",
                 "prometheus.enabled": "false", "storage.map_size": str(1 << 30),
                 **RAFT_TIMING, **election}
        node = Node(load_config(flags, {}, None, root))
        node.start()
        nodes.append(node)
    deadline = time.monotonic() + 120
    while not any(n.raft.is_leader for n in nodes):
        if time.monotonic() > deadline:
            raise SystemExit("no leader within 120 s")
        gevent.sleep(0.1)
    return nodes


def client_job(kind: str, port: int, count: int, max_seconds: float) -> Any:
    """The client process's part: connect (and warm the connection up) for one workload;
    returns the function that runs it."""
    deadline = time.monotonic() + max_seconds
    base = "/API/v1/queues/meter/messages"
    content = json.dumps({"content": "x" * 256, "priority": 10}).encode()
    if kind == "http-enqueue":
        client = Client(port)

        def run() -> None:
            for _ in range(count):
                status, body = client.request("POST", base, content)
                if status != 200 or time.monotonic() > deadline:
                    raise SystemExit(f"enqueue: {status} {body[:200]!r} (or out of time)")
    elif kind == "http-consume":
        client = Client(port)

        def run() -> None:
            for _ in range(count):
                status, body = client.request("GET", base + "?ack=false")
                if status != 200 or time.monotonic() > deadline:
                    raise SystemExit(f"dequeue: {status} {body[:200]!r} (or out of time)")
                status, body = client.request("POST", f"{base}/{json.loads(body)['id']}/ack")
                if status != 200:
                    raise SystemExit(f"ack: {status} {body[:200]!r}")
    else:
        import grpc

        from doq_lib.pb import doq_pb2 as pb
        from doq_lib.pb import doq_pb2_grpc as pb_grpc
        stub = pb_grpc.DOQStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        request = pb.EnqueueRequest(queueName="meter", priority=10, content="x" * 256)
        take = pb.DequeueRequest(queueName="meter", ack=False)
        stub.Enqueue(request)                       # connected before the measurement
        stub.Ack(pb.AckRequest(queueName="meter", id=stub.Dequeue(take).id))
        if kind == "grpc-stream":
            return _stream_job(stub, request, count, deadline)

        def run() -> None:
            for _ in range(count):
                if time.monotonic() > deadline:
                    raise SystemExit("out of time")
                if kind == "grpc-enqueue":
                    if not stub.Enqueue(request).success:
                        raise SystemExit("gRPC enqueue failed")
                    continue
                got = stub.Dequeue(take)
                if not got.success or not stub.Ack(
                        pb.AckRequest(queueName="meter", id=got.id)).success:
                    raise SystemExit("gRPC dequeue or ack failed")
    return run


def _stream_job(stub: Any, request: Any, count: int, deadline: float) -> Callable[[], None]:
    """One EnqueueStream, opened (and its first answer taken) before the measurement."""
    import queue

    outgoing: queue.Queue[Any] = queue.Queue()

    def requests() -> Iterator[Any]:
        while (item := outgoing.get()) is not None:
            yield item
    answers = stub.EnqueueStream(requests())
    outgoing.put(request)
    next(answers)

    def run() -> None:
        try:
            for _ in range(count):
                if time.monotonic() > deadline:
                    raise SystemExit("out of time")
                outgoing.put(request)
                if not next(answers).success:
                    raise SystemExit("gRPC stream enqueue failed")
        finally:
            outgoing.put(None)
    return run


def client_main() -> int:
    """The client process (``--client``), started before the cluster (no grpcio threads to
    fork with): for each line ``KIND PORT COUNT MAX_SECONDS`` on stdin, it connects and
    says "ready", runs the workload on the next line and says "done"."""
    for line in sys.stdin:
        kind, port, count, max_seconds = line.split()
        try:
            run = client_job(kind, int(port), int(count), float(max_seconds))
            print("ready", flush=True)
            sys.stdin.readline()
            run()
            print("done", flush=True)
        except BaseException as exc:  # noqa: BLE001 - told to the meter, which stops
            print(f"failed: {exc!r}", flush=True)
            return 1
    return 0


# workload: (client kind, node: leader or follower, port: http or grpc)
PLAN = {"enqueue-leader": ("http-enqueue", "leader"),
        "enqueue-follower": ("http-enqueue", "follower"),
        "consume-ack": ("http-consume", "leader"),
        "grpc-enqueue-leader": ("grpc-enqueue", "leader"),
        "grpc-enqueue-follower": ("grpc-enqueue", "follower"),
        "grpc-consume-ack": ("grpc-consume", "leader"),
        "grpc-stream-leader": ("grpc-stream", "leader"),
        "grpc-stream-follower": ("grpc-stream", "follower")}


class ClientProcess:
    """The client, in a process of its own; each workload connected before it is measured."""

    def __init__(self, repo: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(repo)}
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--client"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def prepare(self, name: str, nodes: list[Any], count: int, max_seconds: float) -> None:
        kind, role = PLAN[name]
        leader = next(n for n in nodes if n.raft.is_leader)
        node = leader if role == "leader" else next(n for n in nodes if n is not leader)
        port = node.http_port if kind.startswith("http") else \
            int(node.service.grpc_addr.rsplit(":", 1)[1])
        self._say(f"{kind} {port} {count} {max_seconds}")
        self._expect("ready")

    def run(self) -> None:
        self._say("go")
        self._expect("done")

    def _say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def _expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if line != word:
            self.proc.kill()
            raise SystemExit(f"the client said {line!r}, not {word!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=300, help="messages per workload")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--repo", default=REPO, help="the checkout whose doq_lib runs")
    ap.add_argument("--calls", action="store_true", help="count calls (slower)")
    ap.add_argument("--callgrind", action="store_true", help="count instructions (valgrind)")
    ap.add_argument("--by-file", action="store_true",
                    help="share of the CPU by source file (cProfile's own time; slower)")
    ap.add_argument("--idle-seconds", type=float, default=3.0)
    ap.add_argument("--max-seconds", type=float, default=1200, help="per workload")
    ap.add_argument("--under-valgrind", help=argparse.SUPPRESS)
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        return client_main()
    if not 10 <= a.n <= 20_000:
        raise SystemExit("-n: 10-20000")
    names = [w for w in a.workloads.split(",") if w]
    if unknown := set(names) - set(WORKLOADS):
        raise SystemExit(f"--workloads: unknown {sorted(unknown)}; known: {WORKLOADS}")
    if a.callgrind and not a.under_valgrind:
        out = tempfile.mkdtemp(prefix="doq-meter-cg-")
        argv = [a for a in sys.argv[1:] if a != "--callgrind"]
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=yes",
               f"--callgrind-out-file={out}/cg.out", sys.executable,
               os.path.abspath(__file__), *argv, "--callgrind", "--under-valgrind", out]
        try:
            done = subprocess.run(cmd, stderr=subprocess.PIPE)
            if done.returncode:
                sys.stderr.write(done.stderr.decode(errors="replace")[-3000:])
            return done.returncode
        finally:
            shutil.rmtree(out, ignore_errors=True)
    sys.path.insert(0, os.path.abspath(a.repo))
    import logging
    logging.basicConfig(level=logging.ERROR)
    from doq_lib.raft import secure

    code_revision = revision(a.repo)
    root = tempfile.mkdtemp(prefix="doq-meter-")
    frames, switches = Frames(secure.SecureConnection), Switches()
    calls, syscalls = Calls(), Syscalls()
    grind = Callgrind(a.under_valgrind) if a.under_valgrind else None
    code = 1
    try:
        client = ClientProcess(a.repo)
        nodes = start_cluster(root, ELECTION_UNDER_VALGRIND if grind else ELECTION)
        leader = next(n for n in nodes if n.raft.is_leader)
        status, body = Client(leader.http_port).request(
            "POST", "/API/v1/queues", json.dumps({"name": "meter", "type": "delayed"}).encode())
        if status != 200:
            raise SystemExit(f"create queue: {status} {body!r}")
        warm = min(50, a.n)
        for name in names:                                # warm every path once
            client.prepare(name, nodes, warm, a.max_seconds)
            client.run()
        idle_rate = None
        if grind is not None:
            grind.zero()
            started = time.monotonic()
            gevent.sleep(a.idle_seconds)
            idle_rate = grind.dump() / (time.monotonic() - started)
        for name in names:
            client.prepare(name, nodes, a.n, a.max_seconds)
            first_index, first_frames = leader.raft.raftCommitIndex, frames.count
            first_switches = switches.count
            plain = grind is None and not a.calls
            if plain:
                syscalls.start()
            if grind is not None:
                grind.zero()
            elif a.calls:
                calls.start()
            profile = cProfile.Profile() if a.by_file else None
            started, first_cpu, first_threads = time.monotonic(), cpu(), thread_cpu()
            if profile is not None:
                profile.enable()
            client.run()
            if profile is not None:
                profile.disable()
            elapsed, used = time.monotonic() - started, cpu() - first_cpu
            threads = thread_cpu()
            hub_us = 1e6 * (threads.get(os.getpid(), 0.0) - first_threads.get(os.getpid(), 0.0))
            row: dict[str, Any] = {"workload": name, "n": a.n, "code": code_revision}
            if grind is not None:
                raw = grind.dump()
                assert idle_rate is not None
                row["instr"] = round((raw - idle_rate * elapsed) / a.n)
                row["instr_raw"] = round(raw / a.n)
            elif a.calls:
                calls.stop()
            row.update({
                "entries": round((leader.raft.raftCommitIndex - first_index) / a.n, 3),
                "frames": round((frames.count - first_frames) / a.n, 2),
                "switches": round((switches.count - first_switches) / a.n, 1),
                "cpu_us": round(1e6 * used / a.n), "hub_cpu_us": round(hub_us / a.n),
                "wall_us": round(1e6 * elapsed / a.n)})
            if plain:
                sent = syscalls.stop()
                row["syscalls"] = None if sent is None else round(sent / a.n, 1)
            elif a.calls:
                row.update(calls.report(a.n))
            if profile is not None:
                row["by_file"] = by_file(profile)
            print(json.dumps(row), flush=True)
        code = 0
    except BaseException:  # noqa: BLE001 - said before the hard exit below
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        shutil.rmtree(root, ignore_errors=True)
        os._exit(code)      # the nodes' threads and greenlets need no orderly stop here


if __name__ == "__main__":
    sys.exit(main())
