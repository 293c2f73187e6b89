"""Partitions (issue acceptance): the minority refuses writes and never applies them, the
majority keeps serving, and after healing the cut-off node steps down and catches up.

Each scenario runs in a private network namespace (``unshare --net``) with iptables rules
between the nodes' loopback addresses (tests/probes/partition_probe.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.harness import REPO

pytestmark = pytest.mark.slow
PROBE = os.path.join(REPO, "tests", "probes", "partition_probe.py")


def run_probe(tmp_path: object, scenario: str) -> dict[str, object]:
    for tool in ("unshare", "iptables", "ip"):
        assert shutil.which(tool), f"{tool} is needed for partition tests (.ci/run installs it)"
    done = subprocess.run(["unshare", "--net", "--", sys.executable, PROBE, str(tmp_path),
                           scenario], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("scenario", ["leader", "follower"])
def test_partition_minority_refuses_majority_serves_heal_converges(
        tmp_path: object, scenario: str) -> None:
    out = run_probe(tmp_path, scenario)
    minority: list[int] = out["minority_writes"]  # type: ignore[assignment]
    contents: list[str] = out["contents"]  # type: ignore[assignment]
    assert minority and all(500 <= s < 600 for s in minority), out
    assert out["majority_writes"] == [200, 200], out
    assert out["victim_role_during_partition"] != "leader", out
    assert out["victim_ready_during_partition"] is False
    assert out["leaders_after_heal"] == [out["agreed_leader"]], "one leader after healing"
    assert out["replicas_identical"] is True
    assert not [c for c in contents if c.startswith("minority-")], "a refused write was applied"
    majority_writes = sorted(c for c in contents if c.startswith("majority-"))
    assert len(majority_writes) == 2 and sorted(contents) == ["before", *majority_writes]
