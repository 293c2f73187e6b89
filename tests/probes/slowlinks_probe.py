"""Slow and lossy links between the nodes of a real 3-node cluster, in a private namespace.

Run by tests/cluster/test_slow_links.py as ``unshare --net -- python slowlinks_probe.py DIR``.
Nodes live on 127.0.0.11-13; every Raft link goes through the delay proxy of
tests/slowlinks.py (set up before the nodes start), and packet loss comes from iptables'
statistic match between the node addresses. The probe writes to the leader one message at a
time through four phases of a few seconds each: calm, 50 ms ± 10 ms each way, the same with
10 % loss, and calm again; then it reads every message back and compares the replicas. Prints
one JSON object: per phase the writes sent, acknowledged, refused and their latencies (ms).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.harness import Cluster  # noqa: E402
from tests.slowlinks import LinkProxy  # noqa: E402

HOSTS = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
PHASES = [("calm", 0.0, 0.0, 0.0), ("delay", 0.050, 0.010, 0.0),
          ("delay_loss", 0.050, 0.010, 0.10), ("healed", 0.0, 0.0, 0.0)]
PHASE_SECONDS = 4.0


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


def lose(c: Cluster, loss: float) -> None:
    sh("iptables", "-F", "INPUT")
    if loss:
        for node in c.nodes:
            for other in c.nodes:
                if other is not node:
                    sh("iptables", "-A", "INPUT", "-s", node.host, "-d", other.host, "-m",
                       "statistic", "--mode", "random", "--probability", str(loss),
                       "-j", "DROP")


def phase(c: Cluster, name: str, counter: list[int]) -> tuple[dict[str, Any], list[str]]:
    times, statuses, acked = [], [], []
    end = time.monotonic() + PHASE_SECONDS
    while time.monotonic() < end and len(statuses) < 2000:
        content = f"{name}-{counter[0]}"
        counter[0] += 1
        started = time.monotonic()
        try:
            node = c.leader(timeout=10)
            status = node.http(timeout=20).post("/API/v1/queues/slow/messages",
                                                {"content": content, "priority": 1}).status
        except (OSError, AssertionError, RuntimeError):
            status = -1
        times.append(1000 * (time.monotonic() - started))
        statuses.append(status)
        if status == 200:
            acked.append(content)
    ok = [t for t, s in zip(times, statuses) if s == 200]
    return {"sent": len(statuses), "acked": len(acked),
            "other": sorted({s for s in statuses if s != 200}),
            "min_ms": round(min(ok), 1) if ok else None,
            "p50_ms": round(statistics.median(ok), 1) if ok else None,
            "max_ms": round(max(ok), 1) if ok else None}, acked


def main(root: str) -> dict[str, Any]:
    sh("ip", "link", "set", "lo", "up")
    c = Cluster(root, size=3, hosts=HOSTS, flags={"logging.level": "warning"})
    links = LinkProxy([(n.host, n.raft_port) for n in c.nodes], seed=1)
    out: dict[str, Any] = {"phases": {}}
    acked: list[str] = []
    try:
        c.start()
        assert c.leader().http().post("/API/v1/queues",
                                      {"name": "slow", "type": "delayed"}).status == 200
        counter = [0]
        for name, delay, jitter, loss in PHASES:
            links.set(delay, jitter)
            lose(c, loss)
            out["phases"][name], mine = phase(c, name, counter)
            acked += mine
        lose(c, 0.0)
        states = c.assert_replicas_identical(timeout=60)
        out["replicas_identical"] = len({s["digest"] for s in states}) == 1
        http = c.leader().http(timeout=20)
        got: list[str] = []
        while len(got) < 10_000:
            r = http.get("/API/v1/queues/slow/messages?ack=true")
            if r.status != 200:
                break
            got.append(r.json()["content"])
        out["acked_missing"] = sorted(set(acked) - set(got))
        out["delivered_twice"] = len(got) - len(set(got))
        for node in c.nodes:
            node.check_log()
    finally:
        c.stop()
        links.close()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
