"""A short soak (scripts/soak.py; docs/RELIABILITY.md records a 30-minute run): two minutes
of mixed traffic on 3 nodes, then the chaos harness's invariants, and memory, file
descriptors, the journal and the store checked for growth."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.harness import REPO

pytestmark = pytest.mark.slow


def test_two_minutes_of_mixed_traffic_leave_nothing_growing(tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "soak.py"), "--minutes", "2",
         "--sample", "3", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, (summary["violations"], done.stderr[-2000:])
    assert summary["violations"] == []
    assert summary["enqueued_acked"] > 1000 and summary["mixer_rounds"] > 30
    assert summary["mixer_errors"] == 0 and set(summary["nodes"]) == {
        "node-0", "node-1", "node-2"}
