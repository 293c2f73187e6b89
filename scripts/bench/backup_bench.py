#!/usr/bin/env python3
"""Backup and restore of a large store: time, throughput and the node's memory.

Starts a node (single-node cluster by default: the store size, not replication, is what is
measured; --nodes 3 for a cluster), fills it through the HTTP API with --gib GiB of distinct
--size-byte messages, then:

  backup    POST /db/backup (full), streamed to a file; the leader's RSS (all, and the
            anonymous part) is sampled every 50 ms during the transfer
  restore   the file into a second, empty node of the same shape (POST /db/restore,
            octet-stream); the same figures

Prints one JSON line per phase. Loopback only; every loop is bounded by count and time.

  python scripts/bench/backup_bench.py --gib 1
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from tests.harness import Cluster, NodeProc, rss_kib  # noqa: E402


class Sampler:
    """Peak RSS of a process, sampled in a thread while a phase runs: all of it, and the
    anonymous part (the process's own memory; the rest is LMDB's file pages, page cache
    that the kernel can drop)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.peak_anon = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, rss_kib(self.pid))
        self.peak_anon = max(self.peak_anon, rss_kib(self.pid, "RssAnon"))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(0.05)

    def __enter__(self) -> "Sampler":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()


def fill(node: NodeProc, gib: float, size: int, workers: int, deadline: float) -> int:
    conn = node.http()
    assert conn.post("/API/v1/queues", {"name": "big", "type": "delayed"}).status == 200
    count = int(gib * (1 << 30) / size)
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    block = "".join(rng.choice(alphabet) for _ in range(size))
    local = threading.local()

    def one(i: int) -> None:
        if time.monotonic() > deadline:
            raise TimeoutError("fill took too long")
        http = getattr(local, "http", None) or node.http(timeout=60)
        local.http = http
        content = f"{i:012d}" + block[12:]                 # distinct contents
        r = http.post("/API/v1/queues/big/messages", {"content": content, "priority": 1})
        assert r.status == 200, r.body[:200]

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(count)))
    return count


def timed(pid: int, fn: Callable[[], Any]) -> tuple[Any, float, dict[str, int]]:
    before, before_anon = rss_kib(pid), rss_kib(pid, "RssAnon")
    with Sampler(pid) as sampler:
        start = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - start
    return result, seconds, {
        "rss_before_mib": before // 1024, "rss_peak_mib": sampler.peak // 1024,
        "anon_before_mib": before_anon // 1024, "anon_peak_mib": sampler.peak_anon // 1024,
        "anon_after_mib": rss_kib(pid, "RssAnon") // 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="store size to fill, GiB")
    ap.add_argument("--size", type=int, default=256 * 1024, help="message size, bytes")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--max-seconds", type=float, default=1800)
    ap.add_argument("--keep", action="store_true", help="keep the data directories")
    args = ap.parse_args()
    deadline = time.monotonic() + args.max_seconds
    root = tempfile.mkdtemp(prefix="doq-backup-bench-")
    src = Cluster(os.path.join(root, "src"), size=args.nodes)
    dst = Cluster(os.path.join(root, "dst"), size=args.nodes)
    try:
        src.start(60)
        leader = src.leader()
        assert leader.proc is not None
        t0 = time.perf_counter()
        count = fill(leader, args.gib, args.size, args.workers, deadline)
        fill_s = time.perf_counter() - t0
        store = os.path.join(root, "src", leader.node_id, "store", "data.mdb")
        print(json.dumps({"phase": "fill", "messages": count, "size": args.size,
                          "seconds": round(fill_s, 1),
                          "store_bytes": os.path.getsize(store)}), flush=True)

        path = os.path.join(root, "full.bak")

        def backup() -> int:
            conn = http.client.HTTPConnection(leader.host, leader.http_port, timeout=600)
            conn.request("POST", "/db/backup", body=b'{"since": 0}',
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200, response.read()[:200]
            written = 0
            with open(path, "wb") as f:
                while block := response.read(1 << 20):
                    f.write(block)
                    written += len(block)
            conn.close()
            return written

        written, seconds, mem = timed(leader.proc.pid, backup)
        print(json.dumps({"phase": "backup", "bytes": written, "seconds": round(seconds, 2),
                          "mib_s": round(written / seconds / (1 << 20), 1), **mem}),
              flush=True)

        dst.start(60)
        target = dst.leader()
        assert target.proc is not None

        def restore() -> Any:
            conn = http.client.HTTPConnection(target.host, target.http_port, timeout=1800)
            with open(path, "rb") as f:
                conn.request("POST", "/db/restore", body=f, headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(os.path.getsize(path))})
                response = conn.getresponse()
                body = response.read()
            conn.close()
            assert response.status == 200, body[:300]
            return json.loads(body)

        result, seconds, mem = timed(target.proc.pid, restore)
        print(json.dumps({"phase": "restore", "records": result["records"],
                          "seconds": round(seconds, 2),
                          "mib_s": round(written / seconds / (1 << 20), 1), **mem}),
              flush=True)
        same = {s["queue_digest"] for s in src.states()} == \
            {s["queue_digest"] for s in dst.states()}
        print(json.dumps({"phase": "check", "identical": same}), flush=True)
    finally:
        src.stop()
        dst.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
