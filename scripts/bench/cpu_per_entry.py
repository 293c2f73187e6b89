#!/usr/bin/env python3
"""CPU per replicated entry: one client, one enqueue at a time, an otherwise idle cluster.

Starts a local 3-node cluster (or uses --urls with --pids; with --compare, a second cluster
from another checkout, and every step alternates between the two), waits until it is quiet,
then:

  idle     each node's CPU (user + system, from /proc) over --idle-seconds, in % of a core;
  enqueue  --samples sequential single enqueues to the leader (--via follower: to a follower,
           which forwards them) (each waits for its 200); per
           node: CPU ms per enqueue and context switches per enqueue; the client's latency
           p50 / p99.

Prints one JSON line per repetition and the medians. Bounded by --samples and --max-seconds;
only loopback is used.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_bench  # noqa: E402 - the same cluster set-up

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS        # utime + stime


def switches(pid: int) -> int:
    total = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    # threads: sum over /proc/PID/task
    for task in os.listdir(f"/proc/{pid}/task"):
        if int(task) == pid:
            continue
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches",
                                        "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


def request(conn: http.client.HTTPConnection, method: str, path: str,
            body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    conn.request(method, path, body=data, headers=headers)
    response = conn.getresponse()
    raw = response.read()
    return response.status, json.loads(raw) if raw else None


def leader_index(ports: list[int], deadline: float) -> int:
    while time.monotonic() < deadline:
        for n, port in enumerate(ports):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                status, body = request(conn, "GET", "/internal/status")
                conn.close()
                if status == 200 and body["raft"]["state"] == "leader" and \
                        body["raft"]["has_quorum"]:
                    return n
            except OSError:
                pass
        time.sleep(0.2)
    raise SystemExit("no leader")


def run_once(args: argparse.Namespace, clusters: list[tuple[list[int], list[int]]]
             ) -> list[dict[str, Any]]:
    """One measurement of every cluster ((http ports, pids) each). With several clusters the
    enqueues alternate between them, one at a time, so that each sees the same machine."""
    deadline = time.monotonic() + args.max_seconds
    conns, queues, leads = [], [], []
    for ports, _ in clusters:
        lead = leader_index(ports, deadline)
        target = lead if args.via == "leader" else (lead + 1) % len(ports)
        conn = http.client.HTTPConnection("127.0.0.1", ports[target], timeout=10)
        queue = f"cpu-{int(time.time() * 1000)}"
        request(conn, "DELETE", f"/API/v1/queues/{queue}")
        status, body = request(conn, "POST", "/API/v1/queues", {"name": queue, "type": "delayed"})
        assert status == 200, body
        conns.append(conn)
        queues.append(queue)
        leads.append(lead)
    all_pids = [pids for _, pids in clusters]
    time.sleep(args.settle)
    c0 = [[cpu_seconds(p) for p in pids] for pids in all_pids]
    time.sleep(args.idle_seconds)
    c1 = [[cpu_seconds(p) for p in pids] for pids in all_pids]
    idle = [[100 * (b - a) / args.idle_seconds for a, b in zip(x, y)] for x, y in zip(c0, c1)]
    content = "x" * args.size
    latencies: list[list[float]] = [[] for _ in clusters]
    s0 = [[switches(p) for p in pids] for pids in all_pids]
    c0 = [[cpu_seconds(p) for p in pids] for pids in all_pids]
    started = time.monotonic()
    for _ in range(args.samples):
        if time.monotonic() > deadline:
            break
        for k, conn in enumerate(conns):
            t = time.perf_counter()
            status, body = request(conn, "POST", f"/API/v1/queues/{queues[k]}/messages",
                                   {"content": content, "priority": 1})
            latencies[k].append(time.perf_counter() - t)
            assert status == 200, body
    elapsed = time.monotonic() - started
    c1 = [[cpu_seconds(p) for p in pids] for pids in all_pids]
    s1 = [[switches(p) for p in pids] for pids in all_pids]
    rows = []
    for k, conn in enumerate(conns):
        request(conn, "DELETE", f"/API/v1/queues/{queues[k]}")
        conn.close()
        lat = sorted(latencies[k])
        n = len(lat)
        rows.append({
            "samples": n, "seconds": round(elapsed, 2),
            "enqueue_p50_ms": round(1e3 * lat[n // 2], 3),
            "enqueue_p99_ms": round(1e3 * lat[min(n - 1, int(n * 0.99))], 3),
            "nodes": [{"role": "leader" if i == leads[k] else "follower",
                       "idle_pct": round(idle[k][i], 2),
                       "cpu_ms_per_enqueue": round(1e3 * (c1[k][i] - c0[k][i]) / n, 3),
                       "switches_per_enqueue": round((s1[k][i] - s0[k][i]) / n, 2)}
                      for i in range(len(all_pids[k]))],
        })
    return rows


def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)
    out: dict[str, Any] = {k: med([r[k] for r in rows])
                           for k in ("enqueue_p50_ms", "enqueue_p99_ms")}
    by_role: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        followers = sorted((x for x in r["nodes"] if x["role"] == "follower"),
                           key=lambda x: x["cpu_ms_per_enqueue"])
        leader = [x for x in r["nodes"] if x["role"] == "leader"]
        for name, node in [("leader", leader[0])] + [(f"follower{i + 1}", f)
                                                     for i, f in enumerate(followers)]:
            by_role.setdefault(name, []).append(node)
    for name, nodes in by_role.items():
        out[name] = {k: med([x[k] for x in nodes])
                     for k in ("idle_pct", "cpu_ms_per_enqueue", "switches_per_enqueue")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--urls", help="comma-separated loopback node URLs (needs --pids)")
    ap.add_argument("--pids", help="the nodes' process ids, in --urls order")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--idle-seconds", type=float, default=10)
    ap.add_argument("--settle", type=float, default=3, help="quiet seconds before measuring")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=120)
    ap.add_argument("--flag", action="append", default=[], help="extra node flag")
    ap.add_argument("--via", choices=["leader", "follower"], default="leader",
                    help="send the enqueues to the leader or to a follower (forwarded)")
    ap.add_argument("--repo", help="run the nodes from this checkout (default: this one)")
    ap.add_argument("--compare", help="also start a cluster from this checkout (e.g. a git "
                    "worktree of the code before a change); enqueues alternate between the "
                    "two clusters so both see the same machine")
    args = ap.parse_args()
    started: list[Any] = []
    if args.urls:
        urls = [u.strip().rstrip("/") for u in args.urls.split(",")]
        if any(not u.startswith(("http://127.", "http://localhost")) for u in urls):
            raise SystemExit("only loopback URLs are allowed")
        if not args.pids:
            raise SystemExit("--urls needs --pids")
        clusters = [([int(u.rsplit(":", 1)[1]) for u in urls],
                     [int(p) for p in args.pids.split(",")])]
    else:
        repos = [args.repo or http_bench.REPO] + ([args.compare] if args.compare else [])
        for repo in repos:
            http_bench.REPO = os.path.abspath(repo)
            started.append(http_bench.LocalCluster(3, args.flag))
        clusters = [(c.http_ports, [p.pid for p in c.procs]) for c in started]
    names = ["this" if not args.repo else args.repo] + (["compare"] if args.compare else [])
    try:
        for ports, _ in clusters:
            leader_index(ports, time.monotonic() + 60)
        rows: list[list[dict[str, Any]]] = [[] for _ in clusters]
        for _ in range(args.repeat):
            for k, row in enumerate(run_once(args, clusters)):
                print(json.dumps({"code": names[k], **row}), flush=True)
                rows[k].append(row)
    finally:
        for cluster in started:
            cluster.stop()
    for k, name in enumerate(names):
        print(json.dumps({"code": name, "median": medians(rows[k]), "repeat": args.repeat}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
