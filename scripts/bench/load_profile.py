"""Where the CPU of a loaded cluster goes: CPU per message, split into user and system time,
and messages per Raft entry, for one checkout under the shared harness's load.

    python scripts/bench/load_profile.py [--repo DIR] [--target http|grpc] [--workload all]
                                         [-n 20000] [--flag=--raft.pipeline_entries=4]
                                         [--harness-python PY] [--py-spy OUT_PREFIX]

Starts a fresh 3-node cluster of ``--repo`` (this checkout by default) on loopback, runs the
shared harness (``../shared/bench/queue_bench.py``: 32 producers, 32 consumers, one message
per request) against it once, and prints one JSON line: the harness's rates, the CPU the three
node processes used per message (``/proc/<pid>/stat``, user and system apart; a message of
the ``all`` workload is counted once produced and once consumed), and how many messages each
committed Raft entry carried (the leader's ``doq_raft_commit_index`` before and after). Where
``replication_meter.py`` counts one message at a time, this shows what batching does under
load; compare two checkouts or two settings in turn, in the same session (the machine's
speed drifts). ``--py-spy PREFIX`` also records an on-CPU profile of each node (``py-spy
record --gil``, raw stacks in ``PREFIX-<node>.txt``).

Bounded: the harness has a message count and a time cap; only loopback addresses are used;
the cluster is stopped (by the PIDs this script started) at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import side_by_side  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def commit_index(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("doq_raft_commit_index "):
                return float(line.split()[1])
    raise SystemExit(f"no doq_raft_commit_index at {url}/metrics")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=REPO, help="the checkout whose cluster runs")
    ap.add_argument("--target", choices=["http", "grpc"], default="http")
    ap.add_argument("--workload", choices=["all", "produce", "consume"], default="produce")
    ap.add_argument("-n", type=int, default=20000, help="messages per phase")
    ap.add_argument("--max-seconds", type=float, default=120)
    ap.add_argument("--flag", action="append", default=[], help="extra node flag")
    ap.add_argument("--harness-python", default=sys.executable)
    ap.add_argument("--py-spy", default="", help="record on-CPU profiles to PREFIX-<i>.txt")
    a = ap.parse_args()
    spy = shutil.which("py-spy") or ""
    if a.py_spy and not spy:
        raise SystemExit("--py-spy: no py-spy on PATH (pip install py-spy)")
    flags = ["--grpc.address=127.0.0.1:0", "--prometheus.enabled=true", *a.flag]
    cluster = side_by_side.Checkout(os.path.abspath(a.repo), flags)
    spies: list[subprocess.Popen[bytes]] = []
    try:
        cluster.wait_ready()
        if a.target == "grpc":
            args = ["--target", "doq-grpc", "--doq-grpc-addrs", cluster.grpc_addrs(),
                    "--doq-project", os.path.abspath(a.repo)]
        else:
            args = ["--target", "doq-http"]
        args += ["--doq-urls", ",".join(cluster.urls), "--server-pids", cluster.pids(),
                 "--queue", "profile", "-n", str(a.n), "--max-seconds", str(a.max_seconds),
                 "--workload", a.workload]
        if a.py_spy:
            spies = [subprocess.Popen([spy, "record", "-p", str(p.pid), "-r", "200", "-f", "raw",
                                       "--gil", "--nonblocking", "-o", f"{a.py_spy}-{i}.txt"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for i, p in enumerate(cluster.procs)]
        first = commit_index(cluster.urls[0])
        before = [cpu_seconds(p.pid) for p in cluster.procs]
        result: dict[str, Any] = side_by_side.harness(a.harness_python, args)
        after = [cpu_seconds(p.pid) for p in cluster.procs]
        entries = commit_index(cluster.urls[0]) - first
        messages = sum(result.get(f"{phase}_n") or 0 for phase in ("produce", "consume"))
        user = sum(x[0] - y[0] for x, y in zip(after, before))
        system = sum(x[1] - y[1] for x, y in zip(after, before))
        print(json.dumps({
            "target": a.target, "workload": a.workload, "flags": a.flag,
            **{k: result.get(k) for k in ("produce_msgs_s", "consume_msgs_s", "enq_p50_ms",
                                         "enq_p99_ms")},
            "messages": messages, "entries": entries,
            "messages_per_entry": round(messages / entries, 2) if entries else None,
            "user_us_per_message": round(1e6 * user / messages) if messages else None,
            "system_us_per_message": round(1e6 * system / messages) if messages else None,
        }), flush=True)
        return 0
    finally:
        for s in spies:
            s.send_signal(signal.SIGINT)
        for s in spies:
            try:
                s.wait(timeout=30)
            except subprocess.TimeoutExpired:
                s.kill()
        cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main())
