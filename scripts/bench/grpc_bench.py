#!/usr/bin/env python3
"""gRPC benchmark of a local 3-node DOQ cluster (fsync-majority durability on).

Starts three nodes on loopback with gRPC listeners (or uses --urls / --targets of a running
cluster), then runs, --repeat times, each workload on a fresh queue (type delayed) with
distinct random --size-byte payloads (never repeated):

  unary            --producers coroutines, unary Enqueue, each waiting for its answer. msgs/s.
                   (--unary-messages, by default half of --messages: it is the slow one.)
  stream           --streams EnqueueStream calls, each pipelining a --window of outstanding
                   requests; responses are checked for count and order. msgs/s.
  batch            EnqueueBatch calls of --batch messages, --batchers concurrent. msgs/s.
  batch-stream     --streams EnqueueBatchStream calls of --batch-message batches, each with
                   --window-batches batches outstanding. msgs/s.
  consume          fill a queue (EnqueueBatch, untimed), then --consumers DequeueStream
                   subscriptions (ack=false, --credit, re-granted as messages arrive,
                   --max-batch messages per response) that
                   acknowledge with AckBatch (at --ack-batch ids or when idle, at most
                   --ack-inflight calls out per consumer). msgs/s until the last ack returns;
                   failed_ids, redeliveries and what is left in the queue are reported.
  consume-autoack  the same with ack=true and no acks. msgs/s.
  wakeup           a DequeueStream (credit 1, ack=true) waits on an empty queue; --wakeup-trials
                   times: pause 20-60 ms, unary Enqueue, time until the consumer has the message,
                   from the enqueue's answer (t2-t1) and from its send (t2-t0). p50/p99/max ms.
  latency          one client, one unary Enqueue at a time: p50/p99 over --latency-samples.

The client is one asyncio process (grpc.aio, uvloop if installed): the cores are shared with
the nodes, so throughput rows also give the CPU used by the client, the nodes and the leader
(% of one core). Prints one JSON line per workload and repetition, then a Markdown table of
the medians across repetitions. Every load loop is bounded by a message count and
--max-seconds; a row cut short by the time bound is marked "partial". Only loopback is used.

  python scripts/bench/grpc_bench.py --messages 2000 --repeat 1
  python scripts/bench/grpc_bench.py --workloads stream,batch --target leader
  python scripts/bench/grpc_bench.py --urls http://127.0.0.1:8001,http://127.0.0.1:8002,...
  python scripts/bench/grpc_bench.py --targets 127.0.0.1:9001,127.0.0.1:9002,...
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import grpc  # noqa: E402
from http_bench import free_ports  # noqa: E402 - the same port picking

from doq_lib.pb import doq_pb2 as pb  # noqa: E402
from doq_lib.pb import doq_pb2_grpc as pb_grpc  # noqa: E402

WORKLOADS = ["unary", "stream", "batch", "batch-stream", "consume", "consume-autoack", "wakeup",
             "latency"]
RPC_TIMEOUT = 30.0          # seconds, any unary call
READY_TIMEOUT = 60.0        # seconds to wait for the cluster (readyz, leader, queue creation)
GRACE = 30.0                # hard bound of a workload: --max-seconds + GRACE, then cancelled
MAX_IDS = 10_000            # ids per AckBatch call at most (the server's limit)
FILL_BATCH = 1000           # EnqueueBatch size used to fill queues for the consume workloads
PRIORITY = 10               # a unix second long past: deliverable at once
LOOPBACK = ("127.", "localhost")


def _die_with_parent() -> None:
    """In a node's process: be killed should this script die without stopping it (Linux).
    SIGKILL, not SIGTERM: the death signal can arrive twice, and a node signalled again while
    stopping runs Node.stop twice (the second fails on the closed LMDB environment)."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LocalCluster:
    """``size`` nodes of ``doq.py serve`` on loopback, data and logs in a temp dir."""

    def __init__(self, size: int, flags: list[str], keep_dir: bool) -> None:
        self.dir = tempfile.mkdtemp(prefix="doq-grpc-bench-")
        self.keep_dir = keep_dir
        ports = free_ports(3 * size)
        self.http_ports, raft = ports[:size], ports[size:2 * size]
        self.grpc_ports = ports[2 * size:]
        peers = ",".join(f"127.0.0.1:{p}" for p in raft)
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for i in range(size):
                args = [sys.executable, os.path.join(REPO, "doq.py"), "serve",
                        f"--cluster.node_id=node-{i}", f"--http.port={self.http_ports[i]}",
                        "--http.host=127.0.0.1", f"--raft.address=127.0.0.1:{raft[i]}",
                        f"--grpc.address=127.0.0.1:{self.grpc_ports[i]}",
                        f"--cluster.peers={peers}", f"--storage.data_dir={self.dir}", *flags]
                with open(self.log_path(i), "wb") as log:
                    # Own session: a Ctrl-C reaches this script only, which stops the nodes.
                    self.procs.append(subprocess.Popen(
                        args, stdout=log, stderr=log, cwd=self.dir, start_new_session=True,
                        preexec_fn=_die_with_parent))
        except BaseException:
            self.stop()
            raise

    def log_path(self, i: int) -> str:
        return os.path.join(self.dir, f"node-{i}.log")

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.http_ports]

    @property
    def targets(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.grpc_ports]

    def stop(self, timeout: float = 10.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"node pid {p.pid} ignored SIGTERM: killed", file=sys.stderr)
                p.kill()
                p.wait(timeout=5)
        self.report_logs()
        if self.keep_dir:
            print(f"cluster dir kept: {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def report_logs(self, show: int = 5) -> None:
        """Nodes log at level warning: anything they wrote is worth a look."""
        for i in range(len(self.procs)):
            try:
                with open(self.log_path(i), errors="replace") as f:
                    lines = [line.rstrip() for line in f if line.strip()]
            except OSError:
                continue
            if lines:
                print(f"node-{i} log: {len(lines)} line(s), first {min(show, len(lines))}:",
                      file=sys.stderr)
                for line in lines[:show]:
                    print(f"  {line[:300]}", file=sys.stderr)


# -- cluster discovery over HTTP -----------------------------------------------------------------

def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_cluster(urls: list[str], procs: list[subprocess.Popen[bytes]]) -> list[dict[str, Any]]:
    """Wait until every node answers /readyz with 200 and one reports being the leader;
    returns the /internal/status of each node."""
    deadline = time.monotonic() + READY_TIMEOUT
    last: Any = None
    while time.monotonic() < deadline:
        dead = [p.pid for p in procs if p.poll() is not None]
        if dead:
            raise SystemExit(f"node process(es) {dead} exited during start-up")
        try:
            if all(http_get(f"{u}/readyz")[0] == 200 for u in urls):
                status = [json.loads(http_get(f"{u}/internal/status")[1]) for u in urls]
                leaders = [s for s in status if s.get("raft", {}).get("state") == "leader"]
                if len(leaders) == 1:
                    return status
                last = f"{len(leaders)} leaders"
            else:
                last = "not ready"
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(0.2)
    raise SystemExit(f"cluster not ready within {READY_TIMEOUT:.0f} s: {last}")


# -- payloads and statistics ---------------------------------------------------------------------

class Payloads:
    """Distinct random printable payloads: a running counter, then random base64 text."""

    def __init__(self, seed: int, size: int) -> None:
        self.rng = random.Random(seed)
        self.size = size
        self.counter = itertools.count()

    def one(self) -> str:
        body = base64.b64encode(self.rng.randbytes(self.size * 3 // 4 + 3)).decode()
        tag = f"{next(self.counter):x}."
        return (tag + body)[:self.size] if self.size > len(tag) + 8 else body[:self.size]

    def take(self, n: int) -> list[str]:
        return [self.one() for _ in range(n)]


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


def ms(x: float) -> float:
    return round(x * 1e3, 3)


def rate(n: int, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else 0.0


class Errors:
    """RPC failures of a workload: a count and the first few descriptions."""

    def __init__(self) -> None:
        self.count = 0
        self.samples: list[str] = []

    def add(self, what: str, exc: BaseException) -> None:
        self.count += 1
        if len(self.samples) < 3:
            if isinstance(exc, grpc.aio.AioRpcError):
                text = f"{what}: {exc.code().name} {exc.details()}"
            else:
                text = f"{what}: {type(exc).__name__} {exc}"
            self.samples.append(text[:300])

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"errors": self.count}
        if self.samples:
            out["error_samples"] = self.samples
        return out


# -- the benchmark -------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace, targets: list[str], leader: str | None,
                 node_pids: list[int]) -> None:
        self.a = args
        self.node_pids = node_pids
        self.targets = targets
        self.leader = leader
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.stubs: dict[str, pb_grpc.DOQStub] = {}
        self.payloads = Payloads(args.seed, args.size)
        self.rng = random.Random(args.seed + 1)
        self.seq = itertools.count()

    # -- plumbing --------------------------------------------------------------------------------
    async def open(self) -> None:
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
                   ("grpc.max_send_message_length", 64 * 1024 * 1024)]
        for t in dict.fromkeys(self.targets + ([self.leader] if self.leader else [])):
            ch = grpc.aio.insecure_channel(t, options=options)
            self.channels[t] = ch
            self.stubs[t] = pb_grpc.DOQStub(ch)
        for t, ch in self.channels.items():
            try:
                await asyncio.wait_for(ch.channel_ready(), READY_TIMEOUT)
            except asyncio.TimeoutError:
                raise SystemExit(f"gRPC endpoint {t} not reachable") from None

    async def close(self) -> None:
        for ch in self.channels.values():
            await ch.close()

    def node_for(self, worker: int) -> str:
        if self.a.target == "all":
            return self.targets[worker % len(self.targets)]
        if self.a.target == "leader" and self.leader:
            return self.leader
        return self.targets[0]

    def stub_for(self, worker: int) -> pb_grpc.DOQStub:
        return self.stubs[self.node_for(worker)]

    @property
    def admin(self) -> pb_grpc.DOQStub:
        return self.stubs[self.leader or self.targets[0]]

    async def new_queue(self, workload: str) -> str:
        """Create a fresh delayed queue through the leader and wait until every node used
        by the workers knows it."""
        name = f"bench-{os.getpid()}-{workload}-{next(self.seq)}"
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                await self.admin.CreateQueue(pb.CreateQueueRequest(
                    name=name, type="delayed", settings=pb.QueueSettings()), timeout=RPC_TIMEOUT)
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"create queue {name}: {exc.code().name} "
                                     f"{exc.details()}") from None
                await asyncio.sleep(0.2)
        for t in self.stubs:
            while True:
                try:
                    await self.stubs[t].GetQueue(pb.GetQueueRequest(name=name),
                                                 timeout=RPC_TIMEOUT)
                    break
                except grpc.aio.AioRpcError as exc:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"queue {name} unknown on {t}: "
                                         f"{exc.details()}") from None
                    await asyncio.sleep(0.05)
        return name

    async def drop_queue(self, name: str) -> None:
        try:
            await self.admin.DeleteQueue(pb.DeleteQueueRequest(name=name), timeout=RPC_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            print(f"delete queue {name}: {exc.code().name} {exc.details()}", file=sys.stderr)

    async def queue_counts(self, name: str) -> dict[str, int]:
        r = await self.admin.GetQueue(pb.GetQueueRequest(name=name), timeout=RPC_TIMEOUT)
        return {"ready": r.ready, "unacked": r.unacked, "total": r.total}

    def cpu(self) -> tuple[float, list[float]]:
        """CPU seconds used so far by this client and by each local node (Linux /proc)."""
        nodes = []
        for pid in self.node_pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                nodes.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
            except (OSError, ValueError, IndexError):
                nodes.append(float("nan"))
        return time.process_time(), nodes

    def used(self, since: tuple[float, list[float]], seconds: float,
             now: tuple[float, list[float]] | None = None) -> dict[str, Any]:
        """CPU use from ``since`` to ``now`` (cpu() snapshots; default: now), in % of one
        core over ``seconds``: the client, the nodes together, and the leader."""
        if seconds <= 0:
            return {}
        client, nodes = now or self.cpu()
        out: dict[str, Any] = {"client_cpu_pct": round(100 * (client - since[0]) / seconds, 1)}
        if nodes:
            each = [round(100 * (b - a) / seconds, 1) for a, b in zip(since[1], nodes)]
            out["nodes_cpu_pct"] = round(sum(each), 1)
            if self.leader in self.targets:
                out["leader_cpu_pct"] = each[self.targets.index(self.leader)]
        return out

    def request(self, queue: str, content: str) -> pb.EnqueueRequest:
        return pb.EnqueueRequest(queueName=queue, content=content, priority=PRIORITY)

    # -- enqueue workloads -----------------------------------------------------------------------
    async def unary(self, queue: str, payloads: list[str]) -> dict[str, Any]:
        it = iter(payloads)
        errors = Errors()
        mismatched = [0]
        deadline = time.monotonic() + self.a.max_seconds

        async def worker(w: int) -> int:
            stub = self.stub_for(w)
            sent = 0
            for content in it:
                try:
                    r = await stub.Enqueue(self.request(queue, content), timeout=RPC_TIMEOUT)
                except grpc.aio.AioRpcError as exc:
                    errors.add("Enqueue", exc)
                    break
                mismatched[0] += r.content != content
                sent += 1
                if time.monotonic() > deadline:
                    break
            return sent

        cpu, start = self.cpu(), time.perf_counter()
        done = sum(await asyncio.gather(*(worker(w) for w in range(self.a.producers))))
        elapsed = time.perf_counter() - start
        return {"messages": done, "seconds": round(elapsed, 3), "msgs_s": rate(done, elapsed),
                "partial": done < len(payloads), "mismatched": mismatched[0],
                **self.used(cpu, elapsed), **errors.fields()}

    async def stream(self, queue: str, payloads: list[str]) -> dict[str, Any]:
        errors = Errors()
        out_of_order = [0]
        deadline = time.monotonic() + self.a.max_seconds
        n = self.a.streams
        shares = [payloads[i::n] for i in range(n)]

        async def one(w: int, mine: list[str]) -> int:
            call = self.stub_for(w).EnqueueStream(timeout=self.a.max_seconds + GRACE)
            window = asyncio.Semaphore(self.a.window)
            outstanding: collections.deque[str] = collections.deque()
            written = [0]

            async def writer() -> None:
                try:
                    for content in mine:
                        if time.monotonic() > deadline:
                            break
                        await window.acquire()
                        outstanding.append(content)
                        await call.write(self.request(queue, content))
                        written[0] += 1
                finally:
                    if not call.done():
                        await call.done_writing()

            wtask = asyncio.create_task(writer())
            got = 0
            try:
                while True:
                    r = await call.read()
                    if r is grpc.aio.EOF:
                        break
                    if not outstanding:
                        out_of_order[0] += 1          # a response to nothing sent
                        continue
                    out_of_order[0] += r.content != outstanding.popleft()
                    got += 1
                    window.release()
                await wtask
            except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
                errors.add("EnqueueStream", exc)
            finally:
                if not wtask.done():
                    wtask.cancel()
                await asyncio.gather(wtask, return_exceptions=True)
            if got != written[0]:
                errors.add("EnqueueStream", RuntimeError(f"{written[0]} sent, {got} answered"))
            return got

        cpu, start = self.cpu(), time.perf_counter()
        done = sum(await asyncio.gather(*(one(w, s) for w, s in enumerate(shares))))
        elapsed = time.perf_counter() - start
        return {"messages": done, "seconds": round(elapsed, 3), "msgs_s": rate(done, elapsed),
                "partial": done < len(payloads), "out_of_order": out_of_order[0],
                **self.used(cpu, elapsed), **errors.fields()}

    async def batch_stream(self, queue: str, payloads: list[str]) -> dict[str, Any]:
        """--streams EnqueueBatchStream calls, each with --window-batches batches of --batch
        messages outstanding; every answer must carry as many ids as its batch had."""
        errors = Errors()
        mismatched = [0]
        deadline = time.monotonic() + self.a.max_seconds
        size = self.a.batch
        chunks = [payloads[i:i + size] for i in range(0, len(payloads), size)]
        n = self.a.streams
        shares = [chunks[i::n] for i in range(n)]

        async def one(w: int, mine: list[list[str]]) -> int:
            call = self.stub_for(w).EnqueueBatchStream(timeout=self.a.max_seconds + GRACE)
            window = asyncio.Semaphore(self.a.window_batches)
            outstanding: collections.deque[int] = collections.deque()

            async def writer() -> None:
                try:
                    for chunk in mine:
                        if time.monotonic() > deadline:
                            break
                        await window.acquire()
                        outstanding.append(len(chunk))
                        await call.write(pb.EnqueueBatchRequest(
                            messages=[self.request(queue, c) for c in chunk]))
                finally:
                    if not call.done():
                        await call.done_writing()

            wtask = asyncio.create_task(writer())
            got = 0
            try:
                while True:
                    r = await call.read()
                    if r is grpc.aio.EOF:
                        break
                    expected = outstanding.popleft() if outstanding else -1
                    mismatched[0] += len(r.ids) != expected
                    got += len(r.ids)
                    window.release()
                await wtask
            except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
                errors.add("EnqueueBatchStream", exc)
            finally:
                if not wtask.done():
                    wtask.cancel()
                await asyncio.gather(wtask, return_exceptions=True)
            return got

        cpu, start = self.cpu(), time.perf_counter()
        done = sum(await asyncio.gather(*(one(w, s) for w, s in enumerate(shares))))
        elapsed = time.perf_counter() - start
        return {"messages": done, "seconds": round(elapsed, 3), "msgs_s": rate(done, elapsed),
                "partial": done < len(payloads), "mismatched_batches": mismatched[0],
                **self.used(cpu, elapsed), **errors.fields()}

    async def batch(self, queue: str, payloads: list[str]) -> dict[str, Any]:
        b = self.a.batch
        it = iter([payloads[i:i + b] for i in range(0, len(payloads), b)])
        errors = Errors()
        mismatched = [0]
        deadline = time.monotonic() + self.a.max_seconds

        async def worker(w: int) -> int:
            stub = self.stub_for(w)
            sent = 0
            for chunk in it:
                req = pb.EnqueueBatchRequest(messages=[self.request(queue, c) for c in chunk])
                try:
                    r = await stub.EnqueueBatch(req, timeout=RPC_TIMEOUT)
                except grpc.aio.AioRpcError as exc:
                    errors.add("EnqueueBatch", exc)
                    break
                if len(r.ids) != len(chunk) or len(set(r.ids)) != len(chunk):
                    mismatched[0] += 1
                sent += len(r.ids)
                if time.monotonic() > deadline:
                    break
            return sent

        cpu, start = self.cpu(), time.perf_counter()
        done = sum(await asyncio.gather(*(worker(w) for w in range(self.a.batchers))))
        elapsed = time.perf_counter() - start
        return {"messages": done, "seconds": round(elapsed, 3), "msgs_s": rate(done, elapsed),
                "partial": done < len(payloads), "mismatched_batches": mismatched[0],
                **self.used(cpu, elapsed), **errors.fields()}

    # -- consume workloads -----------------------------------------------------------------------
    async def fill(self, queue: str, payloads: list[str]) -> set[int]:
        """Enqueue ``payloads`` with EnqueueBatch (untimed); their ids."""
        chunks = iter([payloads[i:i + FILL_BATCH] for i in range(0, len(payloads), FILL_BATCH)])
        ids: set[int] = set()

        async def worker() -> None:
            for chunk in chunks:
                req = pb.EnqueueBatchRequest(messages=[self.request(queue, c) for c in chunk])
                r = await self.admin.EnqueueBatch(req, timeout=RPC_TIMEOUT)
                ids.update(r.ids)

        await asyncio.gather(*(worker() for _ in range(4)))
        return ids

    async def consume(self, queue: str, payloads: list[str], ack: bool) -> dict[str, Any]:
        """Drain a filled queue with DequeueStream consumers. With ``ack`` false (manual acks)
        each consumer acknowledges with AckBatch, at most --ack-inflight calls outstanding
        (ids received meanwhile go into its next call), and the run ends when every message
        was received and every ack answered; with ``ack`` true when every message was
        received."""
        expected = await self.fill(queue, payloads)
        n = len(expected)
        a = self.a
        credit = max(1, a.credit)
        regrant = max(1, credit // 4)
        errors = Errors()
        seen: set[int] = set()
        st: dict[str, Any] = {"received": 0, "dup": 0, "unknown": 0, "ack_calls": 0, "acked": 0,
                              "failed": 0, "unanswered": 0, "max_ack_ids": 0}
        finished = asyncio.Event()
        end: list[Any] = []                       # (perf_counter, cpu snapshot) at the end
        ack_tasks: set[asyncio.Task[None]] = set()
        buffers: list[list[int]] = [[] for _ in range(a.consumers)]
        inflight = [0] * a.consumers
        last_rx = [0.0] * a.consumers

        def finish() -> None:
            if not finished.is_set():
                end.append((time.perf_counter(), self.cpu()))
                finished.set()

        def check_done() -> None:
            if len(seen) >= n and (ack or st["unanswered"] == 0):
                finish()

        async def send_acks(ids: list[int], w: int) -> None:
            try:
                r = await self.stub_for(w).AckBatch(
                    pb.AckBatchRequest(queueName=queue, ids=ids), timeout=RPC_TIMEOUT)
                st["failed"] += len(r.failed_ids)
                st["acked"] += len(ids) - len(r.failed_ids)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
                errors.add("AckBatch", exc)
            st["ack_calls"] += 1
            st["unanswered"] -= len(ids)
            inflight[w] -= 1
            check_done()
            if buffers[w] and not finished.is_set():
                flush(w)                          # what came in while this call was out

        def flush(w: int) -> None:
            if not buffers[w] or inflight[w] >= a.ack_inflight:
                return
            ids, buffers[w] = buffers[w][:MAX_IDS], buffers[w][MAX_IDS:]
            st["max_ack_ids"] = max(st["max_ack_ids"], len(ids))
            inflight[w] += 1
            task = asyncio.create_task(send_acks(ids, w))
            ack_tasks.add(task)
            task.add_done_callback(ack_tasks.discard)

        async def idle_flusher() -> None:
            idle = a.ack_idle_ms / 1e3
            while not finished.is_set():
                await asyncio.sleep(idle)
                now = time.perf_counter()
                for w in range(a.consumers):
                    if buffers[w] and now - last_rx[w] >= idle:
                        flush(w)

        async def consumer(w: int) -> None:
            call = self.stub_for(w).DequeueStream(timeout=a.max_seconds + GRACE)
            try:
                await call.write(pb.DequeueRequest(queueName=queue, ack=ack, credit=credit,
                                                   max_batch=a.max_batch))
                owed = 0
                pending: list[Any] = []
                while not finished.is_set():
                    if not pending:
                        r = await call.read()
                        if r is grpc.aio.EOF:
                            errors.add("DequeueStream",
                                       RuntimeError("stream ended by the server"))
                            return
                        pending = list(r.messages) if r.messages else [r]
                    r = pending.pop(0)
                    st["received"] += 1
                    if r.id in seen:
                        st["dup"] += 1
                    elif r.id not in expected:
                        st["unknown"] += 1
                    else:
                        seen.add(r.id)
                    if ack:
                        check_done()
                    else:
                        last_rx[w] = time.perf_counter()
                        buffers[w].append(r.id)
                        st["unanswered"] += 1
                        if len(buffers[w]) >= a.ack_batch or len(seen) >= n:
                            flush(w)
                    owed += 1
                    if owed >= regrant and len(seen) < n:
                        await call.write(pb.DequeueRequest(credit=owed))
                        owed = 0
            except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
                if not finished.is_set():
                    errors.add("DequeueStream", exc)
            finally:
                call.cancel()

        cpu, start = self.cpu(), time.perf_counter()
        tasks = [asyncio.create_task(consumer(w)) for w in range(a.consumers)]
        flusher = asyncio.create_task(idle_flusher()) if not ack else None
        try:
            await asyncio.wait_for(finished.wait(), a.max_seconds)
        except asyncio.TimeoutError:
            finish()
        except asyncio.CancelledError:                 # Ctrl-C: leave nothing running
            for t in [*tasks, *ack_tasks, *([flusher] if flusher else [])]:
                t.cancel()
            raise
        partial = len(seen) < n or (not ack and st["unanswered"] > 0)
        for t in tasks:
            t.cancel()
        if flusher:
            flusher.cancel()
        await asyncio.gather(*tasks, *([flusher] if flusher else []), return_exceptions=True)
        if ack_tasks:              # when cut short: let the acks sent so far come back
            await asyncio.wait(list(ack_tasks), timeout=RPC_TIMEOUT)
        elapsed = end[0][0] - start
        done = st["acked"] if not ack else len(seen)
        row: dict[str, Any] = {"messages": done, "seconds": round(elapsed, 3),
                               "msgs_s": rate(done, elapsed), "partial": partial,
                               "received": st["received"], "redelivered": st["dup"],
                               "unknown_ids": st["unknown"], **self.used(cpu, elapsed, end[0][1])}
        if not ack:
            row.update(ack_calls=st["ack_calls"], max_ack_ids=st["max_ack_ids"],
                       failed_ids=st["failed"], unacked_by_client=sum(map(len, buffers)))
        try:
            row["left_in_queue"] = await self.queue_counts(queue)
        except grpc.aio.AioRpcError as exc:
            errors.add("GetQueue", exc)
        return {**row, **errors.fields()}

    # -- latency workloads -----------------------------------------------------------------------
    async def wakeup(self, queue: str) -> dict[str, Any]:
        """A streaming consumer waits on an empty queue; how fast does a new message reach it?
        With --target all the consumer and the producer use different nodes."""
        cnode, pnode = self.node_for(1), self.node_for(0)
        call = self.stubs[cnode].DequeueStream(timeout=self.a.max_seconds + GRACE)
        waiters: dict[str, asyncio.Future[float]] = {}
        stray = [0]
        errors = Errors()
        loop = asyncio.get_running_loop()

        async def reader() -> None:
            while True:
                r = await call.read()
                if r is grpc.aio.EOF:
                    return
                t2 = time.perf_counter()
                fut = waiters.pop(r.content, None)
                if fut is not None and not fut.done():
                    fut.set_result(t2)
                else:
                    stray[0] += 1
                await call.write(pb.DequeueRequest(credit=1))

        async def trial() -> tuple[float, float, float]:
            content = self.payloads.one()
            fut: asyncio.Future[float] = loop.create_future()
            waiters[content] = fut
            await asyncio.sleep(self.rng.uniform(0.020, 0.060))
            t0 = time.perf_counter()
            await self.stubs[pnode].Enqueue(self.request(queue, content), timeout=RPC_TIMEOUT)
            t1 = time.perf_counter()
            t2 = await asyncio.wait_for(fut, 5.0)
            return t0, t1, t2

        after: list[float] = []
        send: list[float] = []
        deadline = time.monotonic() + self.a.max_seconds
        await call.write(pb.DequeueRequest(queueName=queue, ack=True, credit=1))
        rtask = asyncio.create_task(reader())
        try:
            for _ in range(3):                    # warm-up: the subscription is live
                await trial()
            for _ in range(self.a.wakeup_trials):
                if time.monotonic() > deadline:
                    break
                t0, t1, t2 = await trial()
                after.append(t2 - t1)
                send.append(t2 - t0)
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as exc:
            errors.add("wakeup trial", exc)
        finally:
            rtask.cancel()
            await asyncio.gather(rtask, return_exceptions=True)
            call.cancel()
        return {"trials": len(after), "partial": len(after) < self.a.wakeup_trials,
                "consumer_node": cnode, "producer_node": pnode, "leader": self.leader,
                "after_ack_p50_ms": ms(pct(after, 0.5)), "after_ack_p99_ms": ms(pct(after, 0.99)),
                "after_ack_max_ms": ms(max(after, default=float("nan"))),
                "from_send_p50_ms": ms(pct(send, 0.5)), "from_send_p99_ms": ms(pct(send, 0.99)),
                "from_send_max_ms": ms(max(send, default=float("nan"))),
                "stray": stray[0], **errors.fields()}

    async def latency(self, queue: str) -> dict[str, Any]:
        stub = self.stub_for(0)
        samples: list[float] = []
        errors = Errors()
        deadline = time.monotonic() + self.a.max_seconds
        for _ in range(self.a.latency_samples):
            req = self.request(queue, self.payloads.one())
            start = time.perf_counter()
            try:
                await stub.Enqueue(req, timeout=RPC_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                errors.add("Enqueue", exc)
                break
            samples.append(time.perf_counter() - start)
            if time.monotonic() > deadline:
                break
        return {"samples": len(samples), "partial": len(samples) < self.a.latency_samples,
                "node": self.node_for(0), "node_is_leader": self.node_for(0) == self.leader,
                "p50_ms": ms(pct(samples, 0.5)), "p99_ms": ms(pct(samples, 0.99)),
                "max_ms": ms(max(samples, default=float("nan"))), **errors.fields()}

    # -- driver ----------------------------------------------------------------------------------
    async def run_one(self, workload: str) -> dict[str, Any]:
        queue = await self.new_queue(workload)
        count = self.a.unary_messages if workload == "unary" else self.a.messages
        payloads = self.payloads.take(count) if workload not in ("wakeup", "latency") else []
        try:
            if workload == "unary":
                coro = self.unary(queue, payloads)
            elif workload == "stream":
                coro = self.stream(queue, payloads)
            elif workload == "batch":
                coro = self.batch(queue, payloads)
            elif workload == "batch-stream":
                coro = self.batch_stream(queue, payloads)
            elif workload in ("consume", "consume-autoack"):
                coro = self.consume(queue, payloads, ack=workload == "consume-autoack")
            elif workload == "wakeup":
                coro = self.wakeup(queue)
            else:
                coro = self.latency(queue)
            try:
                return await asyncio.wait_for(coro, self.a.max_seconds + 2 * GRACE)
            except asyncio.TimeoutError:
                return {"partial": True, "errors": 1, "error_samples": ["hard time bound hit"]}
        finally:
            if not self.a.keep_queues:
                await self.drop_queue(queue)

    async def run(self) -> list[dict[str, Any]]:
        await self.open()
        rows = []
        try:
            for rep in range(self.a.repeat):
                for workload in self.a.workloads:
                    row = {"rep": rep, "workload": workload, "target": self.a.target,
                           **await self.run_one(workload)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            await self.close()
        return rows


# -- summary -------------------------------------------------------------------------------------

SUMMARY = {  # workload -> figures reported in the table (label, key)
    "unary": [("msgs/s", "msgs_s"), ("leader cpu %", "leader_cpu_pct")],
    "stream": [("msgs/s", "msgs_s"), ("leader cpu %", "leader_cpu_pct"),
               ("out of order", "out_of_order")],
    "batch": [("msgs/s", "msgs_s"), ("leader cpu %", "leader_cpu_pct")],
    "batch-stream": [("msgs/s", "msgs_s"), ("leader cpu %", "leader_cpu_pct")],
    "consume": [("msgs/s", "msgs_s"), ("leader cpu %", "leader_cpu_pct"),
                ("failed_ids", "failed_ids"), ("redelivered", "redelivered")],
    "consume-autoack": [("msgs/s", "msgs_s"), ("leader cpu %", "leader_cpu_pct"),
                        ("redelivered", "redelivered")],
    "wakeup": [("after ack p50 ms", "after_ack_p50_ms"), ("p99", "after_ack_p99_ms"),
               ("max", "after_ack_max_ms"), ("from send p50 ms", "from_send_p50_ms"),
               ("p99", "from_send_p99_ms"), ("max", "from_send_max_ms")],
    "latency": [("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"), ("max ms", "max_ms")],
}


def summarize(rows: list[dict[str, Any]], workloads: list[str]) -> list[dict[str, Any]]:
    out = []
    for w in workloads:
        mine = [r for r in rows if r["workload"] == w]
        if not mine:
            continue
        figures = {}
        for _, key in SUMMARY[w]:
            values = [r[key] for r in mine if isinstance(r.get(key), (int, float))]
            figures[key] = round(statistics.median(values), 3) if values else None
        out.append({"workload": w, "median": figures, "repeat": len(mine),
                    "partial": sum(bool(r.get("partial")) for r in mine),
                    "errors": sum(r.get("errors", 0) for r in mine)})
    return out


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and (v >= 100 or v.is_integer()):
        return f"{v:,.0f}"
    if isinstance(v, float):
        return f"{v:.3g}"
    return f"{v:,}"


def markdown(summary: list[dict[str, Any]]) -> str:
    lines = ["| workload | figures (median) | runs | notes |", "|---|---|---|---|"]
    for s in summary:
        figs = ", ".join(f"{label} {fmt(s['median'][key])}"
                         for label, key in SUMMARY[s["workload"]])
        notes = []
        if s["partial"]:
            notes.append(f"PARTIAL in {s['partial']} run(s): time bound hit")
        if s["errors"]:
            notes.append(f"{s['errors']} error(s)")
        lines.append(f"| {s['workload']} | {figs} | {s['repeat']} | {'; '.join(notes)} |")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------

def csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--urls", help="comma-separated HTTP URLs of a running cluster's nodes "
                                   "(readiness, leader and gRPC addresses are read from them)")
    ap.add_argument("--targets", help="comma-separated gRPC host:port of a running cluster "
                                      "(in the order of --urls when both are given)")
    ap.add_argument("--nodes", type=int, default=3, help="nodes of the local cluster")
    ap.add_argument("--target", choices=["all", "first", "leader"], default="all",
                    help="spread clients over every node, or send everything to the first "
                         "target or to the leader (queues are always created on the leader)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated, from {','.join(WORKLOADS)} (default: all)")
    ap.add_argument("--messages", type=int, default=20000, help="per throughput workload")
    ap.add_argument("--unary-messages", type=int, default=None,
                    help="messages of the unary workload (default: half of --messages: "
                         "unary is the slow one)")
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    ap.add_argument("--producers", type=int, default=32, help="unary: concurrent producers")
    ap.add_argument("--streams", type=int, default=8, help="stream: EnqueueStream calls")
    ap.add_argument("--window", type=int, default=128, help="stream: outstanding per stream")
    ap.add_argument("--batch", type=int, default=100, help="batch: messages per EnqueueBatch")
    ap.add_argument("--batchers", type=int, default=8, help="batch: concurrent calls")
    ap.add_argument("--consumers", type=int, default=8, help="consume: DequeueStream calls")
    ap.add_argument("--credit", type=int, default=128, help="consume: credit per consumer")
    ap.add_argument("--window-batches", type=int, default=4,
                    help="batch-stream: batches outstanding per stream")
    ap.add_argument("--max-batch", type=int, default=64,
                    help="consume: messages per DequeueStream response (0: one, the original "
                         "framing)")
    ap.add_argument("--ack-batch", type=int, default=100,
                    help="consume: send an AckBatch when this many ids are pending")
    ap.add_argument("--ack-inflight", type=int, default=1,
                    help="consume: AckBatch calls outstanding per consumer at most (ids "
                         "received meanwhile go into the next call)")
    ap.add_argument("--ack-idle-ms", type=float, default=5.0,
                    help="consume: flush pending acks after this long without a message")
    ap.add_argument("--wakeup-trials", type=int, default=100)
    ap.add_argument("--latency-samples", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=120,
                    help="time bound of each workload run (rows cut short are 'partial')")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--flag", action="append", default=[],
                    help="extra node flag, e.g. --flag=--raft.max_batch_bytes=262144")
    ap.add_argument("--keep-dir", action="store_true",
                    help="keep the local cluster's data dir and logs")
    ap.add_argument("--keep-queues", action="store_true", help="do not delete the queues")
    ap.add_argument("--no-uvloop", action="store_true")
    args = ap.parse_args()
    args.workloads = csv(args.workloads)
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s): {', '.join(unknown)}")
    if args.unary_messages is None:
        args.unary_messages = max(1, args.messages // 2)
    if min(args.messages, args.unary_messages, args.producers, args.streams, args.window,
           args.batch, args.batchers, args.consumers, args.ack_batch, args.ack_inflight,
           args.repeat) < 1:
        ap.error("counts must be at least 1")
    if args.batch > 10_000 or args.ack_batch > 10_000:
        ap.error("--batch and --ack-batch: at most 10,000 (the server's limit)")

    # SIGTERM ends the run like Ctrl-C, so the nodes are stopped in either case.
    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    cluster = None
    try:
        urls = [u.rstrip("/") for u in csv(args.urls)] if args.urls else []
        targets = csv(args.targets) if args.targets else []
        if any(not u.startswith(tuple(f"http://{p}" for p in LOOPBACK)) for u in urls):
            raise SystemExit("only loopback URLs are allowed")
        if not urls and not targets:
            cluster = LocalCluster(args.nodes, args.flag, args.keep_dir)
            urls, targets = cluster.urls, cluster.targets
        leader = None
        if urls:
            status = wait_cluster(urls, cluster.procs if cluster else [])
            if not targets:
                targets = [s.get("grpc_addr", "") for s in status]
                if not all(targets):
                    raise SystemExit("a node reports no grpc_addr: pass --targets")
            if len(targets) == len(urls):
                leader = next(t for t, s in zip(targets, status)
                              if s["raft"]["state"] == "leader")
        if args.target == "leader" and leader is None:
            raise SystemExit("--target leader needs --urls (to find the leader), in the "
                             "order of --targets if both are given")
        if any(not t.startswith(LOOPBACK) for t in targets):
            raise SystemExit("only loopback gRPC targets are allowed")
        print(json.dumps({"targets": targets, "leader": leader, "target": args.target,
                          "workloads": args.workloads}), file=sys.stderr, flush=True)
        if not args.no_uvloop:
            try:
                import uvloop  # the client shares the cores with the nodes: keep it cheap
                uvloop.install()
            except ImportError:
                pass
        pids = [p.pid for p in cluster.procs] if cluster else []
        rows = asyncio.run(Bench(args, targets, leader, pids).run())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)     # finish stopping the nodes
        if cluster is not None:
            cluster.stop()
    summary = summarize(rows, args.workloads)
    print(json.dumps({"summary": summary, "repeat": args.repeat, "target": args.target,
                      "messages": args.messages, "size": args.size}))
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
