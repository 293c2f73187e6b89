#!/usr/bin/env python3
"""Chaos harness: a 3-node DOQ cluster under load while faults are injected, then invariants.

Runs inside a private network and mount namespace (it re-executes itself under ``unshare
--net --mount``), with the nodes on 127.0.0.11-13 so that iptables rules between those
addresses partition them.
Producers enqueue unique messages; consumers dequeue with ack=false and acknowledge. Every
round injects one fault at random — kill -9 of the leader or a follower, SIGSTOP for a few
seconds, an iptables partition isolating the leader or a follower, a graceful restart, the
wall clock of a node an hour ahead or behind for a few seconds, 5-20 % packet loss on every
link between nodes, slow links (20-100 ms each way with jitter, and 5-20 % loss; a delay
proxy carries every Raft link whenever slow_links is among the faults), a node's disk
filled below its reserve (each node's data is a tmpfs of its own, in a private mount
namespace), a failed journal sync or write (the node stops itself and is started again) —
then heals it and measures how long until the cluster acknowledges writes again.

At the end the load stops, the queue is drained, and these invariants are checked:

  1. every acknowledged enqueue is delivered (to a consumer or by the final drain);
  2. no message acknowledged by a consumer is delivered again afterwards;
  3. no message is delivered to a second consumer while the first one's lease is valid;
  4. the replicas converge to identical state;
  5. after every heal the cluster answers writes again within --max-recovery seconds.

Prints a summary table and exits 1 on any violation. ``--failover-trials N`` instead measures
the time from kill -9 of the leader to the first acknowledged write, N times.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.client import HTTPException
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.harness import (  # noqa: E402
    FAULT_FILES,
    Cluster,
    Http,
    NodeProc,
    fault_file,
    fill_disk,
    wait_until,
)
from tests.slowlinks import LinkProxy  # noqa: E402

HOSTS = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
ACK_TIMEOUT = 3                         # seconds (the queue's lease, via the default)
LEASE_SLACK = 0.2                       # client/server timing slack when judging leases
NETNS_ENV = "DOQ_CHAOS_IN_NETNS"
DISK = 512 << 20                   # each node's data on a tmpfs of this size (pages on use)
RESERVE = 8 << 20                  # storage.min_free_bytes of the nodes


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


# -- recorded history ---------------------------------------------------------------------------
@dataclass
class History:
    lock: threading.Lock = field(default_factory=threading.Lock)
    enqueued: set[str] = field(default_factory=set)             # acknowledged enqueues
    deliveries: list[tuple[str, int, float, float]] = field(default_factory=list)
    acked: dict[str, float] = field(default_factory=dict)      # content -> ack confirmed at
    in_doubt: set[str] = field(default_factory=set)            # ack outcome unknown
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    writes: list[tuple[float, float, bool]] = field(default_factory=list)  # at, seconds, ok
    faults: list[tuple[str, float, float]] = field(default_factory=list)   # kind, start, end


class Load:
    """Bounded producer / consumer threads spreading requests over every node."""

    def __init__(self, nodes: list[NodeProc], history: History, producers: int,
                 consumers: int, seed: int, rate: float) -> None:
        self.nodes, self.h = nodes, history
        self.pause = producers / rate if rate > 0 else 0.0   # per producer, between sends
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._produce, args=(i,), daemon=True)
                        for i in range(producers)]
        self.threads += [threading.Thread(target=self._consume, args=(i, seed + i), daemon=True)
                         for i in range(consumers)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def _http(self, k: int) -> Http:
        node = self.nodes[k % len(self.nodes)]
        return Http(node.http_port, host=node.host, timeout=8)

    def _loop(self, worker: int, step: Callable[[Http, int], None]) -> None:
        k, n = worker, 0
        http = self._http(k)
        while not self.stop.is_set() and n < 1_000_000:
            try:
                step(http, n)
            except (OSError, HTTPException, ValueError) as exc:
                self.h.errors[type(exc).__name__] += 1
                http.close()
                k += 1
                http = self._http(k)
                time.sleep(0.05)
            n += 1

    def _produce(self, worker: int) -> None:
        def step(http: Http, n: int) -> None:
            content = f"p{worker}-{n}"
            sent = time.monotonic()
            try:
                r = http.post("/API/v1/queues/chaos/messages", {"content": content,
                                                                "priority": 1})
            except (OSError, HTTPException):
                with self.h.lock:
                    self.h.writes.append((sent, time.monotonic() - sent, False))
                raise
            with self.h.lock:
                self.h.writes.append((sent, time.monotonic() - sent, r.status == 200))
            if r.status == 200:
                with self.h.lock:
                    self.h.enqueued.add(content)
            else:
                self.h.errors[f"enqueue {r.status}"] += 1
            time.sleep(self.pause)
        self._loop(worker, step)

    def _consume(self, worker: int, seed: int) -> None:
        rng = random.Random(seed)

        def step(http: Http, n: int) -> None:
            sent = time.monotonic()
            r = http.get("/API/v1/queues/chaos/messages?ack=false")
            if r.status != 200:
                time.sleep(0.02)
                return
            got = time.monotonic()
            msg = r.json()
            with self.h.lock:
                self.h.deliveries.append((msg["content"], worker, sent, got))
                self.h.in_doubt.add(msg["content"])
            if rng.random() < 0.05:
                time.sleep(rng.uniform(0.2, 1.0))          # a slow worker
            a = http.post(f"/API/v1/queues/chaos/messages/{msg['id']}/ack")
            with self.h.lock:
                if a.status == 200:
                    self.h.acked.setdefault(msg["content"], time.monotonic())
                if a.status in (200, 400):
                    self.h.in_doubt.discard(msg["content"])
        self._loop(1000 + worker, step)


# -- faults ----------------------------------------------------------------------------------------
class Faults:
    KINDS = ("kill_leader", "kill_follower", "pause", "partition_leader",
             "partition_follower", "restart", "clock_jump", "lossy_links", "disk_full",
             "fsync_error", "write_error", "slow_links")

    def __init__(self, cluster: Cluster, rng: random.Random,
                 links: LinkProxy | None = None) -> None:
        self.c, self.rng, self.links = cluster, rng, links

    def _victim(self, leader: bool) -> NodeProc:
        return self.c.leader() if leader else self.rng.choice(self.c.followers())

    def inject(self, kind: str) -> None:
        {"kill_leader": lambda: self._kill(True), "kill_follower": lambda: self._kill(False),
         "pause": self._pause, "partition_leader": lambda: self._partition(True),
         "partition_follower": lambda: self._partition(False),
         "restart": self._restart, "clock_jump": self._clock_jump,
         "lossy_links": self._lossy_links, "disk_full": self._disk_full,
         "fsync_error": lambda: self._io_error("DOQ_FAULTS_FAIL_FSYNC_FILE"),
         "write_error": lambda: self._io_error("DOQ_FAULTS_FAIL_WRITE_FILE"),
         "slow_links": self._slow_links}[kind]()

    def _kill(self, leader: bool) -> None:
        node = self._victim(leader)
        node.kill()
        time.sleep(self.rng.uniform(1.0, 3.0))
        node.start()

    def _pause(self) -> None:
        node = self._victim(self.rng.random() < 0.5)
        assert node.proc is not None
        node.proc.send_signal(signal.SIGSTOP)
        time.sleep(self.rng.uniform(2.0, 4.0))
        node.proc.send_signal(signal.SIGCONT)

    def _partition(self, leader: bool) -> None:
        node = self._victim(leader)
        for other in self.c.nodes:
            if other is not node:
                for src, dst in ((node.host, other.host), (other.host, node.host)):
                    sh("iptables", "-A", "INPUT", "-s", src, "-d", dst, "-j", "DROP")
        time.sleep(self.rng.uniform(3.0, 5.0))
        sh("iptables", "-F", "INPUT")

    def _clock_jump(self) -> None:
        """The wall clock of the leader or a follower an hour ahead or behind for 3-5 s
        (doq_lib/clock.py's fault injection), then back."""
        node = self._victim(self.rng.random() < 0.5)
        set_clock_offset(node, self.rng.choice((3600, -3600)))
        time.sleep(self.rng.uniform(3.0, 5.0))
        set_clock_offset(node, 0)

    def _lossy_links(self) -> None:
        """Every link between two nodes loses 5-20 % of its packets for 3-5 s (iptables'
        random match: TCP retransmits, so each link turns slow and jittery; this kernel has
        no netem for delay alone). Clients' traffic is not touched."""
        self._drop_between_nodes(self.rng.uniform(0.05, 0.20))
        time.sleep(self.rng.uniform(3.0, 5.0))
        sh("iptables", "-F", "INPUT")

    def _slow_links(self) -> None:
        """Every link between two nodes slow, jittery and lossy for 3-5 s: 20-100 ms each way,
        jitter up to half of that (tests/slowlinks.py: a delay proxy on every Raft link, as
        this kernel has no netem), and 5-20 % of the packets lost. Clients' traffic is not
        touched."""
        assert self.links is not None, "slow_links needs the link proxy (start_cluster)"
        delay = self.rng.uniform(0.020, 0.100)
        self.links.set(delay, self.rng.uniform(0.0, delay / 2))
        try:
            self._drop_between_nodes(self.rng.uniform(0.05, 0.20))
            time.sleep(self.rng.uniform(3.0, 5.0))
        finally:
            sh("iptables", "-F", "INPUT")
            self.links.set(0.0, 0.0)

    def _drop_between_nodes(self, loss: float) -> None:
        for node in self.c.nodes:
            for other in self.c.nodes:
                if other is not node:
                    sh("iptables", "-A", "INPUT", "-s", node.host, "-d", other.host, "-m",
                       "statistic", "--mode", "random", "--probability", f"{loss:.3f}",
                       "-j", "DROP")

    def _disk_full(self) -> None:
        """The disk of the leader or a follower filled to 2 MiB below its reserve for 3-5 s:
        that node refuses new messages (507), consumers go on; then the space is freed."""
        node = self._victim(self.rng.random() < 0.5)
        path = fill_disk(os.path.join(node.data_dir, node.node_id), 2 << 20)
        time.sleep(self.rng.uniform(3.0, 5.0))
        os.remove(path)

    def _io_error(self, variable: str) -> None:
        """The next journal sync (DOQ_FAULTS_FAIL_FSYNC_FILE) or write
        (DOQ_FAULTS_FAIL_WRITE_FILE: EIO) of the leader or a follower fails (fault injection):
        the node stops itself (fail-stop); it is started again 1-3 s later."""
        node = self._victim(self.rng.random() < 0.5)
        path = fault_file(node, variable)
        open(path, "w").close()
        deadline = time.monotonic() + 15
        while node.alive() and time.monotonic() < deadline:
            time.sleep(0.05)                       # the next write makes it sync
        os.remove(path)
        if node.alive():
            raise RuntimeError(f"{node.node_id} kept running after a failed journal sync or write")
        time.sleep(self.rng.uniform(1.0, 3.0))
        node.start()

    def _restart(self) -> None:
        node = self.rng.choice(self.c.nodes)
        node.stop()
        node.start()


_probes = iter(range(10**9))


def time_to_write(cluster: Cluster, limit: float) -> float:
    """Seconds until some node acknowledges a write (probing every node in turn)."""
    start = time.monotonic()
    k = 0
    while time.monotonic() - start < limit:
        node = cluster.nodes[k % len(cluster.nodes)]
        k += 1
        try:
            r = Http(node.http_port, host=node.host, timeout=2).post(
                "/API/v1/queues/chaos/messages",
                {"content": f"probe-{next(_probes)}", "priority": 1})
            if r.status == 200:
                return time.monotonic() - start
        except (OSError, HTTPException):
            pass
        time.sleep(0.05)
    return float("inf")


# -- invariants ------------------------------------------------------------------------------------
def drain(cluster: Cluster, stall: float = 30.0) -> list[str]:
    """Dequeue with ack=true until the queue is empty (unacked ones come back after the lease);
    fails if nothing comes out for ``stall`` seconds while messages remain."""
    got: list[str] = []
    progress = time.monotonic()
    http = cluster.leader().http(timeout=10)
    while time.monotonic() - progress < stall:
        r = http.get("/API/v1/queues/chaos/messages?ack=true")
        if r.status == 200:
            got.append(r.json()["content"])
            progress = time.monotonic()
        elif http.get("/API/v1/queues/chaos").json()["total"] == 0:
            return got
        else:
            time.sleep(0.2)
    raise RuntimeError(f"the queue stopped draining after {len(got)} messages")


def check(h: History, drained: list[str], recoveries: list[float],
          max_recovery: float) -> list[str]:
    problems = []
    delivered = {d[0] for d in h.deliveries} | set(drained)
    lost = h.enqueued - delivered
    if lost:
        problems.append(f"{len(lost)} acknowledged enqueues never delivered, e.g. "
                        f"{sorted(lost)[:3]}")
    for content, worker, sent, _ in h.deliveries:
        acked_at = h.acked.get(content)
        if acked_at is not None and sent > acked_at:
            problems.append(f"{content} delivered again (to consumer {worker}) after its ack")
    again = [c for c in drained if c in h.acked]
    if again:
        problems.append(f"{len(again)} consumer-acknowledged messages came back in the drain, "
                        f"e.g. {again[:3]}")
    doubled = [c for c, n in collections.Counter(drained).items() if n > 1]
    if doubled:
        problems.append(f"{len(doubled)} messages stored twice, e.g. {doubled[:3]}")
    problems += lease_violations(h.deliveries)
    slow = [r for r in recoveries if r > max_recovery]
    if slow:
        problems.append(f"{len(slow)} heals took longer than {max_recovery}s to accept writes")
    return problems


def lease_violations(deliveries: list[tuple[str, int, float, float]]) -> list[str]:
    """A second delivery received before the first one's lease (>= sent + ack timeout) ends."""
    by_content: dict[str, list[tuple[float, float, int]]] = collections.defaultdict(list)
    for content, worker, sent, got in deliveries:
        by_content[content].append((sent, got, worker))
    out = []
    for content, seen in by_content.items():
        seen.sort()
        for (sent1, _, w1), (_, got2, w2) in zip(seen, seen[1:]):
            if got2 < sent1 + ACK_TIMEOUT - LEASE_SLACK:
                out.append(f"{content}: delivered to {w1} then to {w2} within its lease")
    return out


# -- runs ------------------------------------------------------------------------------------------
def set_clock_offset(node: NodeProc, seconds: float) -> None:
    with open(fault_file(node, "DOQ_FAULTS_CLOCK_OFFSET_FILE"), "w", encoding="ascii") as f:
        f.write(str(seconds))


def start_cluster(root: str, links: bool = False) -> tuple[Cluster, LinkProxy | None]:
    """The cluster, and with ``links`` every Raft link between its nodes through a delay
    proxy (set up before the nodes start, so that no connection bypasses it)."""
    sh("ip", "link", "set", "lo", "up")
    c = Cluster(root, size=3, hosts=HOSTS,
                flags={"queue.default_acknowledgement_timeout": str(ACK_TIMEOUT),
                       "logging.level": "warning", "storage.min_free_bytes": str(RESERVE)},
                env={"DOQ_FAULTS_ENABLED": "1"})
    for node in c.nodes:
        for variable in FAULT_FILES:                   # clock jumps, failed syncs
            node.env[variable] = fault_file(node, variable)
        directory = os.path.join(root, node.node_id)    # a disk of its own, to fill
        os.makedirs(directory, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", directory)
    proxy = LinkProxy([(n.host, n.raft_port) for n in c.nodes]) if links else None
    try:
        c.start()
        assert c.leader().http().post("/API/v1/queues", {"name": "chaos", "type": "delayed"}
                                      ).status == 200
    except BaseException:
        c.stop()
        if proxy:
            proxy.close()
        raise
    return c, proxy


def run_rounds(args: argparse.Namespace, c: Cluster,
               links: LinkProxy | None = None) -> dict[str, Any]:
    rng = random.Random(args.seed)
    h = History()
    load = Load(c.nodes, h, args.producers, args.consumers, args.seed, args.rate)
    faults = Faults(c, rng, links)
    kinds: collections.Counter[str] = collections.Counter()
    recoveries = []
    load.start()
    try:
        for round_no in range(args.rounds):
            time.sleep(args.calm)
            kind = args.kinds[round_no % len(args.kinds)] if args.cycle \
                else rng.choice(args.kinds)
            kinds[kind] += 1
            started = time.monotonic()
            faults.inject(kind)
            h.faults.append((kind, started, time.monotonic()))
            recoveries.append(time_to_write(c, 60))
            print(f"round {round_no + 1}/{args.rounds}: {kind}, writes again after "
                  f"{recoveries[-1]:.2f}s", file=sys.stderr, flush=True)
    finally:
        load.finish()
        subprocess.run(["iptables", "-F", "INPUT"], capture_output=True, timeout=20)
    c.wait_ready(60)
    states = c.assert_replicas_identical(timeout=60)
    drained = drain(c)
    problems = check(h, drained, recoveries, args.max_recovery)
    if len({s["digest"] for s in states}) != 1:
        problems.append("replicas diverged")
    return {"rounds": args.rounds, "faults": dict(sorted(kinds.items())),
            "enqueued_acked": len(h.enqueued), "deliveries": len(h.deliveries),
            "consumer_acked": len(h.acked), "acks_in_doubt": len(h.in_doubt),
            "drained_at_end": len(drained),
            "worst_recovery_s": round(max(recoveries, default=0.0), 2),
            "median_recovery_s": round(statistics.median(recoveries), 2) if recoveries else 0,
            "client_errors": dict(h.errors.most_common(8)),
            "writes_during": write_latency(h), "violations": problems}


def write_latency(h: History) -> dict[str, str]:
    """Per fault kind (and "calm": outside every fault), the enqueues sent while it lasted:
    how many, the share acknowledged, and p50 / p99 of their time to answer."""
    spans: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for kind, start, end in h.faults:
        spans[kind].append((start, end))
    out = {}
    for kind in ["calm", *sorted(spans)]:
        if kind == "calm":
            samples = [w for w in h.writes if not any(a <= w[0] <= b for _, a, b in h.faults)]
        else:
            samples = [w for w in h.writes if any(a <= w[0] <= b for a, b in spans[kind])]
        if not samples:
            continue
        times = sorted(s[1] for s in samples)
        ok = sum(1 for s in samples if s[2])
        out[kind] = (f"{len(samples)} sent, {100 * ok / len(samples):.0f} % ok, "
                     f"p50 {1000 * times[len(times) // 2]:.0f} ms, "
                     f"p99 {1000 * times[min(len(times) - 1, int(len(times) * 0.99))]:.0f} ms")
    return out


def run_failover(args: argparse.Namespace, c: Cluster) -> dict[str, Any]:
    times = []
    for _ in range(args.failover_trials):
        wait_until(lambda: time_to_write(c, 10) < 10, 60)
        old = c.leader()
        old.kill()
        times.append(time_to_write(c, 60))
        old.start()
        c.wait_ready(60)
    return {"failover_trials": len(times), "failover_s": [round(t, 2) for t in times],
            "failover_median_s": round(statistics.median(times), 2),
            "failover_max_s": round(max(times), 2), "violations": []}


def print_summary(result: dict[str, Any]) -> None:
    width = max(len(k) for k in result)
    for key, value in result.items():
        shown = json.dumps(value) if isinstance(value, (dict, list)) else value
        print(f"{key:<{width}}  {shown}")
    print(json.dumps(result), file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--calm", type=float, default=2.0, help="seconds of load between faults")
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=150.0,
                    help="total enqueues per second the producers aim at (consumers keep up)")
    ap.add_argument("--max-recovery", type=float, default=15.0)
    ap.add_argument("--failover-trials", type=int, default=0,
                    help="measure leader failover N times instead of running fault rounds")
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--kinds", default=",".join(Faults.KINDS),
                    help="comma-separated faults to choose from (default: all)")
    ap.add_argument("--cycle", action="store_true",
                    help="take the faults of --kinds in turn instead of at random")
    args = ap.parse_args()
    args.kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(args.kinds) - set(Faults.KINDS)
    if unknown or not args.kinds:
        ap.error(f"unknown faults {sorted(unknown)}: choose from {', '.join(Faults.KINDS)}")
    if os.environ.get(NETNS_ENV) != "1":
        env = {**os.environ, NETNS_ENV: "1"}
        return subprocess.call(["unshare", "--net", "--mount", "--", sys.executable,
                                *sys.argv], env=env)
    root = args.data_dir or tempfile.mkdtemp(prefix="doq-chaos-")
    c, links = start_cluster(root, links="slow_links" in args.kinds
                             and not args.failover_trials)
    try:
        result = run_failover(args, c) if args.failover_trials else run_rounds(args, c, links)
    finally:
        c.stop()
        if links:
            links.close()
        if not args.data_dir:
            shutil.rmtree(root, ignore_errors=True)
    print_summary(result)
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
