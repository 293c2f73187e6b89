"""A full disk: below its reserve (storage.min_free_bytes) a node refuses new
messages with 507 and says why in /readyz and the metrics, consuming and acknowledging go
on, nothing acknowledged is lost, and the node takes writes again by itself once space is
freed. On one node, and on the leader or a follower of three; each node's data on a small
tmpfs in a private mount namespace (tests/probes/disk_probe.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.harness import REPO

pytestmark = pytest.mark.slow
PROBE = os.path.join(REPO, "tests", "probes", "disk_probe.py")


def run_probe(tmp_path: object, scenario: str) -> dict[str, object]:
    assert shutil.which("unshare"), "unshare is needed (make test installs util-linux)"
    done = subprocess.run(["unshare", "--mount", "--", sys.executable, PROBE, str(tmp_path),
                           scenario], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("scenario", ["single", "leader", "follower"])
def test_a_full_disk_refuses_new_messages_and_recovers(tmp_path: object, scenario: str) -> None:
    out = run_probe(tmp_path, scenario)
    status, code, message = out["refused"]  # type: ignore[misc]
    assert (status, code) == (507, "insufficient_storage"), out
    assert "storage.min_free_bytes" in message, out
    ready_status, ready_text = out["readyz"]  # type: ignore[misc]
    assert ready_status == 503 and "insufficient storage" in ready_text, out
    assert out["blocked_metric"] == 1 and 0 <= out["free_metric"] < 8 << 20, out  # type: ignore[operator]
    assert (out["dequeue"], out["ack"]) == (200, 200), out        # consumers go on
    if scenario == "follower":
        assert out["other_node"] == [200, None], out              # the leader has room
    if scenario == "leader":
        status, code = out["other_node"]  # type: ignore[misc]
        assert status == 503 and code == "unavailable", out       # refused by the leader
    assert out["after_freeing"] == 200 and out["blocked_after"] == 0, out
    assert out["acked_all_there"] and out["alive"], out
