"""The replication meter (scripts/bench/replication_meter.py) runs and counts what it says:
a short run of two workloads on its in-process cluster, with the client in its own process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.harness import REPO

METER = os.path.join(REPO, "scripts", "bench", "replication_meter.py")


def test_the_meter_counts_entries_frames_and_cpu_per_message() -> None:
    done = subprocess.run(
        [sys.executable, METER, "-n", "20", "--workloads", "enqueue-follower,grpc-consume-ack",
         "--max-seconds", "60"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {row["workload"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert set(rows) == {"enqueue-follower", "grpc-consume-ack"}
    forwarded, consumed = rows["enqueue-follower"], rows["grpc-consume-ack"]
    # one Raft entry per enqueue, two per dequeue + ack (a heartbeat-time entry may add a few)
    assert 1.0 <= forwarded["entries"] <= 1.2 and 2.0 <= consumed["entries"] <= 2.2
    # a forwarded write: the forward, its index, two appends, two acks, two commit sends
    assert 7 <= forwarded["frames"] <= 9
    for row in rows.values():
        assert row["n"] == 20 and row["cpu_us"] > 0 and row["switches"] > 0


def test_the_meter_refuses_what_it_cannot_run() -> None:
    for args in (["-n", "5"], ["--workloads", "enqueue-leader,nonsense"]):
        done = subprocess.run([sys.executable, METER, *args], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode != 0 and ("-n" in done.stderr or "unknown" in done.stderr)
