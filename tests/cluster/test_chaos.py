"""A short run of the chaos harness (scripts/chaos.py; the full run is --rounds 50)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.harness import REPO

pytestmark = pytest.mark.slow


def test_chaos_rounds_keep_every_invariant(tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "chaos.py"), "--rounds", "6",
         "--calm", "1.0", "--seed", "7", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, (summary["violations"], done.stderr[-2000:])
    assert summary["violations"] == []
    assert summary["rounds"] == 6 and sum(summary["faults"].values()) == 6
    assert summary["enqueued_acked"] > 100 and summary["consumer_acked"] > 50
    assert summary["worst_recovery_s"] < 15


def test_the_faults_of_issue_16_keep_every_invariant(tmp_path: object) -> None:
    """5-20 % packet loss between the nodes, an hour's jump of a node's wall clock, a node's
    disk filled below its reserve, a failed journal sync and a failed journal write (the
    node stops and is started again), slow links (20-100 ms each way through the delay
    proxy, with loss), each in turn; writes go on through them (some slower, some refused
    by the full node and sent again elsewhere). Partitions and kills are in the run above;
    with the proxy carrying the Raft links, scripts/chaos.py's default run mixes them all."""
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "chaos.py"), "--rounds", "6",
         "--calm", "1.0", "--seed", "3", "--cycle",
         "--kinds", "lossy_links,clock_jump,disk_full,fsync_error,write_error,slow_links",
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, (summary["violations"], done.stderr[-2000:])
    assert summary["violations"] == []
    assert summary["faults"] == {"lossy_links": 1, "clock_jump": 1, "disk_full": 1,
                                 "fsync_error": 1, "write_error": 1, "slow_links": 1}, summary
    during = summary["writes_during"]
    assert {"calm", "lossy_links", "clock_jump", "disk_full", "fsync_error", "write_error",
            "slow_links"} <= set(during), during
    for kind in ("lossy_links", "slow_links"):
        assert " 0 % ok" not in during[kind], during           # writes still commit
