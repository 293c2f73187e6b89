#!/usr/bin/env python3
"""The Python client's ways to produce, one client thread, against a local 3-node cluster.

Starts three nodes on loopback with gRPC listeners, then runs --repeat rounds; in each round,
on a fresh queue, every way in turn (the order reversed every other round):

  unary      GrpcClient.enqueue, one message at a time (waits for each answer);
  producer   GrpcClient.producer(window=--window).send for every message, then flush();
  http       HttpClient.enqueue, one message at a time.

Prints one JSON line per way and round, then the medians (msg/s) and the producer's ratio to
unary. Bounded by --messages per way and --max-seconds per way; only loopback is used.

  python scripts/bench/client_producer.py --messages 2000 --repeat 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import http_bench  # noqa: E402 - the same cluster set-up

from doq_lib.client import GrpcClient, HttpClient, connect  # noqa: E402


def wait_ready(urls: list[str], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with HttpClient(urls) as h:
                servers = h.servers()
                if h.find_leader() and all(s.grpc_addr for s in servers):
                    return
        except Exception:  # noqa: BLE001 - still starting
            pass
        time.sleep(0.2)
    raise SystemExit("the cluster did not become ready")


def run_way(way: str, urls: list[str], queue: str, n: int, window: int,
            max_seconds: float) -> dict[str, Any]:
    client = connect(urls, transport="http" if way == "http" else "grpc")
    try:
        client.create_queue(queue)
        body = "x" * 256
        started = time.perf_counter()
        deadline = started + max_seconds
        sent = 0
        if way == "producer":
            assert isinstance(client, GrpcClient)
            with client.producer(window=window) as producer:
                futures = []
                while sent < n and time.perf_counter() < deadline:
                    futures.append(producer.send(queue, body, priority=1))
                    sent += 1
                producer.flush(timeout=max_seconds)
                assert all(f.result(timeout=0).id for f in futures)
        else:
            enqueue: Callable[..., Any] = client.enqueue
            while sent < n and time.perf_counter() < deadline:
                enqueue(queue, body, 1)
                sent += 1
        seconds = time.perf_counter() - started
        stored = client.queue(queue).total
        client.delete_queue(queue)
        return {"way": way, "messages": sent, "stored": stored, "seconds": round(seconds, 3),
                "msgs_s": round(sent / seconds, 1), "partial": sent < n}
    finally:
        client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=60)
    a = ap.parse_args()
    if not 1 <= a.messages <= 100_000 or not 1 <= a.repeat <= 10:
        raise SystemExit("--messages 1-100000, --repeat 1-10")
    cluster = http_bench.LocalCluster(3, ["--grpc.address=127.0.0.1:0"])
    rows: dict[str, list[float]] = {}
    try:
        wait_ready(cluster.urls)
        for rnd in range(a.repeat):
            ways = ["unary", "producer", "http"]
            if rnd % 2:
                ways.reverse()
            for way in ways:
                row = run_way(way, cluster.urls, f"cp{rnd}{way}", a.messages, a.window,
                              a.max_seconds)
                row["round"] = rnd
                print(json.dumps(row), flush=True)
                if row["stored"] != row["messages"]:
                    raise SystemExit(f"{way}: {row['stored']} stored of {row['messages']}")
                rows.setdefault(way, []).append(row["msgs_s"])
    finally:
        cluster.stop()
    med = {way: statistics.median(v) for way, v in rows.items()}
    print()
    print("| way | msg/s (median) | runs |")
    print("|---|---|---|")
    for way, values in rows.items():
        print(f"| {way} | {med[way]:,.0f} | {' / '.join(f'{v:,.0f}' for v in values)} |")
    print(f"\nproducer (window {a.window}) / unary: {med['producer'] / med['unary']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
